#ifndef MATERIALIZER_CLIENT_CLI_MATCTL_MAIN_H_
#define MATERIALIZER_CLIENT_CLI_MATCTL_MAIN_H_

// matctl as a function: parse, check against the tables, connect, run the
// command, print the error and a hint, and return the exit status
// (exit_code.h).

#include <ostream>
#include <string>
#include <vector>

#include "client/cli/flags.h"

namespace materializer::client::cli {

// `args` without the program name; `env` reads environment variables.
int MatctlMain(const std::vector<std::string>& args, const Environment& env,
               std::ostream& out, std::ostream& err);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_MATCTL_MAIN_H_
