#include "client/cli/usage.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/connection.h"
#include "client/cli/exit_code.h"

namespace materializer::client::cli {
namespace {

constexpr size_t kWidth = 79;

// `text` wrapped at kWidth, every line after the first indented by
// `indent` spaces (the first continues wherever the caller is).
std::string Wrap(absl::string_view text, size_t indent, size_t first_column) {
  std::string out;
  size_t column = first_column;
  bool line_start = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line_start && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", std::string(indent, ' '));
      column = indent;
      line_start = true;
    }
    if (!line_start) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    line_start = false;
  }
  return out;
}

// "  --name=VALUE   help (default: x; env: VAR)" rows.
std::string FlagRows(const std::vector<const char*>& names) {
  constexpr size_t kHelpColumn = 26;
  std::string out;
  for (const char* name : names) {
    const FlagSpec* spec = FindFlag(FlagTable(), name);
    std::string left = absl::StrCat("  ", FlagSynopsis(*spec));
    std::string help = spec->help;
    if (*spec->default_text != '\0') {
      absl::StrAppend(&help, " (default: ", spec->default_text, ")");
    }
    if (*spec->env != '\0') absl::StrAppend(&help, " [env ", spec->env, "]");
    if (left.size() + 2 > kHelpColumn) {
      absl::StrAppend(&out, left, "\n", std::string(kHelpColumn, ' '));
    } else {
      absl::StrAppend(&out, left, std::string(kHelpColumn - left.size(), ' '));
    }
    absl::StrAppend(&out, Wrap(help, kHelpColumn, kHelpColumn), "\n");
  }
  return out;
}

bool IsRequired(const Command& command, const char* name) {
  for (const char* required : command.required) {
    if (absl::string_view(required) == name) return true;
  }
  return false;
}

std::string FlagPart(const Command& command, const char* name) {
  const std::string synopsis = FlagSynopsis(*FindFlag(FlagTable(), name));
  return IsRequired(command, name) ? absl::StrCat(" ", synopsis)
                                   : absl::StrCat(" [", synopsis, "]");
}

}  // namespace

std::string CommandSynopsis(const Command& command) {
  std::string line = absl::StrCat("matctl [FLAGS] ", command.name);
  for (const char* arg : command.args) absl::StrAppend(&line, " ", arg);
  for (const char* flag : command.flags) {
    absl::StrAppend(&line, FlagPart(command, flag));
  }
  return line;
}

std::string MainUsage() {
  std::string out =
      "usage: matctl [FLAGS] COMMAND [ARGS]\n"
      "       matctl COMMAND --help    (or: matctl help COMMAND)\n\n"
      "commands:\n";
  for (const Command& command : Commands()) {
    std::string left = absl::StrCat("  ", command.name);
    for (const char* arg : command.args) absl::StrAppend(&left, " ", arg);
    constexpr size_t kColumn = 26;
    if (left.size() + 2 > kColumn) {
      absl::StrAppend(&out, left, "\n", std::string(kColumn, ' '));
    } else {
      absl::StrAppend(&out, left, std::string(kColumn - left.size(), ' '));
    }
    absl::StrAppend(&out, Wrap(command.summary, kColumn, kColumn), "\n");
  }
  absl::StrAppend(&out, "\nflags for every command:\n",
                  FlagRows(GlobalFlags()));
  absl::StrAppend(
      &out, "\nbearer token: ",
      Wrap(absl::StrCat("--token_file=FILE, else ", kTokenFileVariable,
                        "=FILE, else ", kTokenVariable,
                        "=TOKEN. There is no flag that takes the token "
                        "itself, so it never shows in a process listing; "
                        "matctl never prints it."),
           2, 14),
      "\n");
  absl::StrAppend(&out, "\nexit status:\n");
  for (const ExitCodeRow& row : ExitCodeTable()) {
    absl::StrAppend(&out, "  ", static_cast<int>(row.code), "  ",
                    Wrap(row.meaning, 5, 5), "\n");
  }
  return out;
}

std::string CommandUsage(const Command& command) {
  std::string out =
      absl::StrCat("usage: ", Wrap(CommandSynopsis(command), 7, 7), "\n\n",
                   Wrap(command.details, 0, 0), "\n");
  if (!command.flags.empty()) {
    absl::StrAppend(&out, "\nflags:\n", FlagRows(command.flags));
  }
  absl::StrAppend(&out,
                  "\nflags for every command (--server, --tls_ca, ...) and "
                  "exit statuses: matctl --help\n");
  return out;
}

}  // namespace materializer::client::cli
