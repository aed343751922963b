#include "server/init/glob.h"

#include "absl/strings/str_cat.h"

namespace materializer::init {
namespace {

// Matches the class starting at pattern[p] == '[' against c. Sets *end to
// the index after ']'. Returns false for a malformed class (no ']').
bool MatchClass(absl::string_view pattern, size_t p, char c, bool* matched,
                size_t* end) {
  size_t i = p + 1;
  bool negated = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negated = true;
    ++i;
  }
  bool found = false;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    char lo = pattern[i];
    char hi = lo;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' &&
        pattern[i + 2] != ']') {
      hi = pattern[i + 2];
      i += 3;
    } else {
      ++i;
    }
    if (lo <= c && c <= hi) found = true;
  }
  if (i >= pattern.size()) return false;  // no closing ']'
  *end = i + 1;
  *matched = found != negated;
  return true;
}

}  // namespace

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  // Iterative matcher with single-star backtracking: on a mismatch, retry
  // from the last '*' consuming one more character. Linear in practice,
  // O(|pattern| * |name|) worst case.
  size_t p = 0;
  size_t n = 0;
  size_t star_p = absl::string_view::npos;
  size_t star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size()) {
      const char pc = pattern[p];
      if (pc == '*') {
        star_p = p++;
        star_n = n;
        continue;
      }
      if (pc == '?') {
        ++p;
        ++n;
        continue;
      }
      if (pc == '[') {
        bool matched = false;
        size_t end = 0;
        if (MatchClass(pattern, p, name[n], &matched, &end)) {
          if (matched) {
            p = end;
            ++n;
            continue;
          }
        } else if (name[n] == '[') {  // malformed class: literal '['
          ++p;
          ++n;
          continue;
        }
      } else if (pc == name[n]) {
        ++p;
        ++n;
        continue;
      }
    }
    if (star_p == absl::string_view::npos) return false;
    p = star_p + 1;
    n = ++star_n;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::Status CheckGlob(absl::string_view pattern) {
  if (pattern.empty()) {
    return absl::InvalidArgumentError(
        "pattern is empty; use \"*\" to match every tensor");
  }
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '[') continue;
    bool matched = false;
    size_t end = 0;
    if (!MatchClass(pattern, i, 'x', &matched, &end)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pattern \"", pattern, "\" has a '[' at ", i, " without a ']'"));
    }
    i = end - 1;
  }
  return absl::OkStatus();
}

}  // namespace materializer::init
