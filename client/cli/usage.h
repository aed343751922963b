#ifndef MATERIALIZER_CLIENT_CLI_USAGE_H_
#define MATERIALIZER_CLIENT_CLI_USAGE_H_

// matctl's help, generated from the command and flag tables.

#include <string>

#include "client/cli/command.h"

namespace materializer::client::cli {

// `matctl --help`: the commands, the global flags with their environment
// variables, the token variables and the exit statuses.
std::string MainUsage();

// `matctl COMMAND --help`: its synopsis, what it does, its flags.
std::string CommandUsage(const Command& command);

// The synopsis line: "matctl [FLAGS] fetch HANDLE -o OUT [--format=...] ...".
std::string CommandSynopsis(const Command& command);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_USAGE_H_
