#include "client/cli/matctl_main.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "client/cli/exit_code.h"
#include "client/cli/hints.h"
#include "client/cli/usage.h"
#include "grpc/support/log.h"

namespace materializer::client::cli {
namespace {

bool IsHelpFlag(const std::string& arg) {
  return arg == "--help" || arg == "-help" || arg == "-h";
}

// A usage error: the reason, then the command's synopsis (or, without a
// command, where to find the list).
int UsageError(std::ostream& err, absl::string_view message,
               const Command* command) {
  err << "matctl: " << message << "\n";
  if (command != nullptr) {
    err << "usage: " << CommandSynopsis(*command) << "\n"
        << "(matctl " << command->name << " --help explains it)\n";
  } else {
    err << "(matctl --help lists every command and flag)\n";
  }
  return kExitUsage;
}

// The flags given on the command line that `command` does not take.
std::string ForeignFlag(const Command& command, const FlagValues& flags) {
  for (const std::string& name : flags.FromCommandLine()) {
    auto is = [&name](const char* candidate) { return name == candidate; };
    if (std::any_of(GlobalFlags().begin(), GlobalFlags().end(), is) ||
        std::any_of(command.flags.begin(), command.flags.end(), is)) {
      continue;
    }
    return flags.Source(name);
  }
  return "";
}

}  // namespace

int MatctlMain(const std::vector<std::string>& all_args, const Environment& env,
               std::ostream& out, std::ostream& err) {
  // --help anywhere before "--" asks for help, whatever else is wrong.
  std::vector<std::string> args;
  bool help = false;
  for (size_t i = 0; i < all_args.size(); ++i) {
    if (all_args[i] == "--") {
      args.insert(args.end(), all_args.begin() + i, all_args.end());
      break;
    }
    if (IsHelpFlag(all_args[i])) {
      help = true;
    } else {
      args.push_back(all_args[i]);
    }
  }

  absl::StatusOr<CommandLine> line = ParseCommandLine(args, FlagTable(), env);
  // The command named, for the synopsis in usage errors.
  const Command* command = nullptr;
  for (const std::string& arg : args) {
    if (!arg.empty() && arg[0] != '-') {
      command = FindCommand(arg);
      break;
    }
  }
  if (help && (!line.ok() || line->positional.empty() ||
               line->positional[0] != "help")) {
    out << (command != nullptr ? CommandUsage(*command) : MainUsage());
    return kExitOk;
  }
  if (!line.ok()) return UsageError(err, line.status().message(), command);
  if (line->positional.empty())
    return UsageError(err, "no command given", nullptr);

  const std::string& name = line->positional[0];
  if (name == "help") {
    if (line->positional.size() > 1) {
      command = FindCommand(line->positional[1]);
      if (command == nullptr) {
        return UsageError(
            err, absl::StrCat("unknown command \"", line->positional[1], "\""),
            nullptr);
      }
      out << CommandUsage(*command);
    } else {
      out << MainUsage();
    }
    return kExitOk;
  }
  command = FindCommand(name);
  if (command == nullptr) {
    return UsageError(err, absl::StrCat("unknown command \"", name, "\""),
                      nullptr);
  }
  std::vector<std::string> command_args(line->positional.begin() + 1,
                                        line->positional.end());
  if (command_args.size() != command->args.size()) {
    return UsageError(
        err,
        absl::StrCat(name, " takes ",
                     command->args.empty()
                         ? std::string("no arguments")
                         : absl::StrCat(command->args.size(), " argument",
                                        command->args.size() == 1 ? "" : "s"),
                     " (got ", command_args.size(), ")"),
        command);
  }
  if (std::string flag = ForeignFlag(*command, line->flags); !flag.empty()) {
    return UsageError(err, absl::StrCat(flag, " does not apply to ", name),
                      command);
  }
  for (const char* required : command->required) {
    if (!line->flags.Has(required)) {
      return UsageError(
          err,
          absl::StrCat(name, " needs ",
                       FlagSynopsis(*FindFlag(FlagTable(), required))),
          command);
    }
  }

  absl::StatusOr<ClientOptions> options = ConnectionOptions(line->flags, env);
  if (!options.ok())
    return UsageError(err, options.status().message(), nullptr);
  // One-shot commands leave detached handles (living by their lease);
  // `session` holds a session for as long as it runs.
  options->session = name == "session";
  if (line->flags.Bool("verbose")) {
    err << "matctl: " << DescribeConnection(*options, line->flags) << "\n";
  } else {
    // gRPC logs some failures itself (a failed TLS handshake); matctl
    // reports them once, in its own words, with a hint.
    gpr_set_log_function([](gpr_log_func_args*) {});
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(*options);
  if (!client.ok()) return UsageError(err, client.status().message(), nullptr);

  Invocation invocation(*command, std::move(command_args),
                        std::move(line->flags), **client, out, err);
  const absl::Status status = command->run(invocation);
  out.flush();
  if (status.ok()) return kExitOk;
  err << "matctl: " << absl::StatusCodeToString(status.code()) << ": "
      << status.message() << "\n";
  if (const std::string hint = HintFor(status, *options); !hint.empty()) {
    err << "hint: " << hint << "\n";
  }
  return ExitCodeFor(status, options->security.UsesTls());
}

}  // namespace materializer::client::cli
