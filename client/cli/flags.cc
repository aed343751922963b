#include "client/cli/flags.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::client::cli {
namespace {

std::string Dashes(const FlagSpec& spec) {
  return absl::string_view(spec.name).size() == 1 ? "-" : "--";
}

// Checks `text` as a value of `spec`; `source` names where it came from.
absl::Status CheckValue(const FlagSpec& spec, const std::string& text,
                        absl::string_view source) {
  switch (spec.type) {
    case FlagType::kBool:
      if (text != "true" && text != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat(source, " must be true or false, not \"", text, "\""));
      }
      return absl::OkStatus();
    case FlagType::kDuration: {
      absl::Duration duration;
      if (!absl::ParseDuration(text, &duration) ||
          duration <= absl::ZeroDuration()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source,
                         " must be a positive duration such as 30s, 10m or 1h, "
                         "not \"",
                         text, "\""));
      }
      return absl::OkStatus();
    }
    case FlagType::kBytes: {
      absl::StatusOr<uint64_t> bytes = ParseBytes(text);
      if (!bytes.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", bytes.status().message()));
      }
      if (*bytes > spec.max_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, " is at most ", spec.max_bytes, " bytes, not ", text));
      }
      return absl::OkStatus();
    }
    case FlagType::kChoice:
      for (const char* choice : spec.choices) {
        if (text == choice) return absl::OkStatus();
      }
      return absl::InvalidArgumentError(
          absl::StrCat(source, " must be ", absl::StrJoin(spec.choices, ", "),
                       ", not \"", text, "\""));
    case FlagType::kString:
    case FlagType::kList:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

bool FlagValues::Has(absl::string_view name) const {
  return values_.find(name) != values_.end();
}

std::string FlagValues::Source(absl::string_view name) const {
  auto it = values_.find(name);
  return it == values_.end() ? "" : it->second.source;
}

std::string FlagValues::String(absl::string_view name,
                               absl::string_view fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string(fallback) : it->second.text;
}

bool FlagValues::Bool(absl::string_view name) const {
  return String(name, "false") == "true";
}

absl::Duration FlagValues::Duration(absl::string_view name,
                                    absl::Duration fallback) const {
  absl::Duration duration = fallback;
  if (Has(name)) absl::ParseDuration(String(name), &duration);
  return duration;
}

uint64_t FlagValues::Bytes(absl::string_view name, uint64_t fallback) const {
  if (!Has(name)) return fallback;
  return ParseBytes(String(name)).value_or(fallback);
}

std::vector<std::string> FlagValues::List(absl::string_view name) const {
  if (!Has(name)) return {};
  return absl::StrSplit(String(name), ',', absl::SkipEmpty());
}

std::vector<std::string> FlagValues::FromCommandLine() const {
  std::vector<std::string> names;
  for (const auto& [name, value] : values_) {
    if (value.from_command_line) names.push_back(name);
  }
  return names;
}

void FlagValues::Set(const std::string& name, std::string value,
                     std::string source, bool from_command_line) {
  values_[name] = Value{std::move(value), std::move(source), from_command_line};
}

const FlagSpec* FindFlag(const std::vector<FlagSpec>& specs,
                         absl::string_view name) {
  for (const FlagSpec& spec : specs) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::string FlagSynopsis(const FlagSpec& spec) {
  const std::string dashes = Dashes(spec);
  if (spec.type == FlagType::kBool) return absl::StrCat(dashes, spec.name);
  if (dashes == "-") return absl::StrCat("-", spec.name, " ", spec.value_name);
  return absl::StrCat(dashes, spec.name, "=", spec.value_name);
}

absl::StatusOr<CommandLine> ParseCommandLine(
    const std::vector<std::string>& args, const std::vector<FlagSpec>& specs,
    const Environment& env) {
  CommandLine line;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      line.positional.insert(line.positional.end(), args.begin() + i + 1,
                             args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      line.positional.push_back(arg);
      continue;
    }
    absl::string_view name = arg;
    absl::ConsumePrefix(&name, "-");
    absl::ConsumePrefix(&name, "-");
    std::optional<std::string> value;
    if (const size_t equals = name.find('='); equals != name.npos) {
      value = std::string(name.substr(equals + 1));
      name = name.substr(0, equals);
    }
    const FlagSpec* spec = FindFlag(specs, name);
    bool negated = false;
    if (spec == nullptr && absl::StartsWith(name, "no")) {
      spec = FindFlag(specs, name.substr(2));
      if (spec != nullptr && spec->type == FlagType::kBool && !value) {
        negated = true;
      } else {
        spec = nullptr;
      }
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", arg.substr(0, arg.find('='))));
    }
    const std::string source = absl::StrCat(Dashes(*spec), spec->name);
    if (spec->type == FlagType::kBool) {
      if (!value) value = negated ? "false" : "true";
    } else if (!value) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, " needs a value (", FlagSynopsis(*spec), ")"));
      }
      value = args[++i];
    }
    RETURN_IF_ERROR(CheckValue(*spec, *value, source));
    line.flags.Set(spec->name, *std::move(value), source,
                   /*from_command_line=*/true);
  }
  for (const FlagSpec& spec : specs) {
    if (*spec.env == '\0' || line.flags.Has(spec.name)) continue;
    std::optional<std::string> value = env(spec.env);
    if (!value.has_value() || value->empty()) continue;
    if (spec.type == FlagType::kBool) {
      const std::string lower = absl::AsciiStrToLower(*value);
      if (lower == "1" || lower == "yes") value = "true";
      if (lower == "0" || lower == "no") value = "false";
    }
    RETURN_IF_ERROR(CheckValue(spec, *value, spec.env));
    line.flags.Set(spec.name, *std::move(value), spec.env,
                   /*from_command_line=*/false);
  }
  return line;
}

}  // namespace materializer::client::cli
