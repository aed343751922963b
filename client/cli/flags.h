#ifndef MATERIALIZER_CLIENT_CLI_FLAGS_H_
#define MATERIALIZER_CLIENT_CLI_FLAGS_H_

// matctl's command line: every flag is declared once, in a table of
// FlagSpec (flag_table.cc), from which the parser checks values, the usage
// text is generated, and environment variables are read.
//
//   ASSIGN_OR_RETURN(CommandLine line, ParseCommandLine(args, FlagTable(),
//                                                       getenv));
//   if (line.flags.Has("all")) ...
//
// Syntax (as Abseil's): --name=value, --name value, -name for any flag;
// --name, --name=true|false and --noname for booleans; "--" ends flags.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace materializer::client::cli {

enum class FlagType {
  kBool,
  kString,
  kDuration,  // "30s", "10m", "inf"; must be positive
  kBytes,     // "4MiB", "1048576"; at most FlagSpec::max_bytes
  kList,      // comma-separated
  kChoice,    // one of FlagSpec::choices
};

struct FlagSpec {
  const char* name;
  FlagType type;
  // What the value is, in usage: "--timeout=DURATION".
  const char* value_name;
  const char* help;
  // The default, as the usage shows it ("" for none).
  const char* default_text = "";
  // Read when the flag is not on the command line ("" for none).
  const char* env = "";
  std::vector<const char*> choices = {};
  uint64_t max_bytes = UINT64_MAX;
};

// The values of the flags that were set, checked against their specs.
//
// Thread-compatible.
class FlagValues {
 public:
  bool Has(absl::string_view name) const;
  // Where a value came from: "--server" or "MATERIALIZER_SERVER".
  std::string Source(absl::string_view name) const;

  // The value of a set flag, else `fallback`. REQUIRES: the flag's type.
  std::string String(absl::string_view name,
                     absl::string_view fallback = "") const;
  bool Bool(absl::string_view name) const;
  absl::Duration Duration(absl::string_view name,
                          absl::Duration fallback) const;
  uint64_t Bytes(absl::string_view name, uint64_t fallback) const;
  std::vector<std::string> List(absl::string_view name) const;

  // The names of the flags set on the command line (not from the
  // environment), for checking them against a command.
  std::vector<std::string> FromCommandLine() const;

  void Set(const std::string& name, std::string value, std::string source,
           bool from_command_line);

 private:
  struct Value {
    std::string text;
    std::string source;
    bool from_command_line = false;
  };
  std::map<std::string, Value, std::less<>> values_;
};

struct CommandLine {
  // Positional arguments: the command name first.
  std::vector<std::string> positional;
  FlagValues flags;
};

using Environment = std::function<std::optional<std::string>(const char*)>;

// Parses `args` (without the program name) against `specs`, then fills
// unset flags that have an environment variable from `env`.
// INVALID_ARGUMENT naming the flag (or variable) for an unknown flag, a
// missing or malformed value.
absl::StatusOr<CommandLine> ParseCommandLine(
    const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
    const Environment& env);

// The spec named `name`, or null.
const FlagSpec* FindFlag(const std::vector<FlagSpec>& specs,
                         absl::string_view name);

// "--timeout=DURATION", "--all", "-o FILE" as usage writes the flag.
std::string FlagSynopsis(const FlagSpec& spec);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_FLAGS_H_
