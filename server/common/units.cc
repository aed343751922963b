#include "server/common/units.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace materializer {
namespace {

// The text a byte-count error echoes, bounded: these messages travel in
// gRPC trailers (server/common/quote.h says why that matters).
std::string Shown(absl::string_view text) {
  constexpr size_t kMaxShown = 64;
  if (text.size() <= kMaxShown) return absl::StrCat("'", text, "'");
  return absl::StrCat("'", text.substr(0, kMaxShown), "...' (", text.size(),
                      " bytes)");
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t split = 0;
  while (split < trimmed.size() &&
         (absl::ascii_isdigit(trimmed[split]) || trimmed[split] == '.')) {
    ++split;
  }
  const absl::string_view number = trimmed.substr(0, split);
  const std::string suffix =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(split)));
  static const std::pair<const char*, double> kSuffixes[] = {
      {"", 1.0},           {"b", 1.0},
      {"k", 1024.0},       {"kib", 1024.0},
      {"kb", 1e3},         {"m", 1048576.0},
      {"mib", 1048576.0},  {"mb", 1e6},
      {"g", 1073741824.0}, {"gib", 1073741824.0},
      {"gb", 1e9},         {"t", 1099511627776.0},
      {"tib", 1099511627776.0}, {"tb", 1e12},
  };
  double multiplier = -1;
  for (const auto& [name, value] : kSuffixes) {
    if (suffix == name) multiplier = value;
  }
  double value = 0;
  if (number.empty() || multiplier < 0 || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Shown(text), " is not a byte count (examples: 1048576, 512MiB, 16GiB)"));
  }
  // Plain integers take the exact integer path: a double would round counts
  // above 2^53.
  if (multiplier == 1.0 && number.find('.') == absl::string_view::npos) {
    uint64_t exact = 0;
    if (absl::SimpleAtoi(number, &exact)) return exact;
    return absl::InvalidArgumentError(
        absl::StrCat(Shown(text), " does not fit in 64 bits"));
  }
  const double bytes = std::floor(value * multiplier);
  // 2^64 is exactly representable; anything at or above it overflows.
  if (!(bytes >= 0) || bytes >= 18446744073709551616.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Shown(text), " does not fit in 64 bits"));
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace materializer
