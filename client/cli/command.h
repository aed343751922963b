#ifndef MATERIALIZER_CLIENT_CLI_COMMAND_H_
#define MATERIALIZER_CLIENT_CLI_COMMAND_H_

// matctl's commands and flags, each declared once: the tables in
// command_table.cc and flag_table.cc drive the parser, the flag checks
// (a command refuses flags that are not its own or global), the generated
// usage (`matctl --help`, `matctl COMMAND --help`) and the tests. Each
// command's code lives in a cmd_*.cc file.

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/cli/flags.h"
#include "client/client.h"

namespace materializer::client::cli {

class Invocation;

struct Command {
  const char* name;
  // Positional arguments, as usage names them ("HANDLE").
  std::vector<const char*> args;
  // One line for the command list.
  const char* summary;
  // What `matctl COMMAND --help` adds: what it does, what it prints.
  const char* details;
  // The command's own flags; the global ones apply to every command.
  std::vector<const char*> flags;
  absl::Status (*run)(Invocation&);
  // Flags (among `flags`) that must be given.
  std::vector<const char*> required = {};
};

// Every flag, once.
const std::vector<FlagSpec>& FlagTable();
// The flags every command accepts.
const std::vector<const char*>& GlobalFlags();
// Every command.
const std::vector<Command>& Commands();
const Command* FindCommand(absl::string_view name);

// One run of one command: its arguments and flags, the client, and where
// it prints.
//
// Thread-compatible.
class Invocation {
 public:
  Invocation(const Command& command, std::vector<std::string> args,
             FlagValues flags, Client& client, std::ostream& out,
             std::ostream& err)
      : command_(command),
        args_(std::move(args)),
        flags_(std::move(flags)),
        client_(client),
        out_(out),
        err_(err) {}

  const Command& command() const { return command_; }
  const std::string& arg(size_t i) const { return args_[i]; }
  const FlagValues& flags() const { return flags_; }
  bool json() const { return flags_.String("output") == "json"; }
  Client& client() { return client_; }
  // Results go to out(); progress, notes and warnings to err().
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }

 private:
  const Command& command_;
  const std::vector<std::string> args_;
  const FlagValues flags_;
  Client& client_;
  std::ostream& out_;
  std::ostream& err_;
};

// The commands (cmd_*.cc).
absl::Status RunPlan(Invocation& invocation);
absl::Status RunMaterialize(Invocation& invocation);
absl::Status RunInspect(Invocation& invocation);
absl::Status RunSession(Invocation& invocation);
absl::Status RunDescribe(Invocation& invocation);
absl::Status RunRelease(Invocation& invocation);
absl::Status RunRenew(Invocation& invocation);
absl::Status RunList(Invocation& invocation);
absl::Status RunExport(Invocation& invocation);
absl::Status RunCloseExport(Invocation& invocation);
absl::Status RunFetch(Invocation& invocation);
absl::Status RunStats(Invocation& invocation);
absl::Status RunHealth(Invocation& invocation);
absl::Status RunDoctor(Invocation& invocation);
absl::Status RunReplicas(Invocation& invocation);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_COMMAND_H_
