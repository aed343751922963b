// Fuzz target: the glob matcher of init rules and fetch filters
// (server/init/glob.h).
//
// Input: PATTERN 0x00 NAME. In both parts the bytes 0xFF N C stand for the
// byte C repeated (N + 1) * 1024 times, so a short input can describe the
// long patterns that cost time (the pattern is capped at 64 KiB; the name at
// the longest tensor name the server accepts, since no longer name is ever
// matched).
//
// Properties, for every pattern Glob::Compile accepts (the server compiles
// every pattern before matching with it):
//   - Glob::Matches and GlobMatch agree with a reference matcher written
//     here from the grammar in glob.h (a table over pattern tokens x name
//     positions);
//   - a pattern made from the name with its special characters quoted as
//     classes matches the name, and "*" matches everything;
//   - one match takes well under a second, however long the pattern: the
//     server matches patterns from requests on its threads;
//   - a refused pattern gets a bounded message (it is echoed to clients)
//     and matches nothing; Compile and CheckGlob agree.

#include <algorithm>
#include <bitset>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz/check.h"
#include "server/init/glob.h"
#include "server/spec/validate.h"

namespace materializer::fuzz {
namespace {

// 128 times the server's own limit (init::kMaxPatternBytes): every longer
// pattern takes the same path (refused on its size, its quote bounded),
// and building 4 MiB strings, as this target once did, spent a third of
// its time in page faults.
constexpr size_t kMaxPatternBytes = init::kMaxPatternBytes * 128;
constexpr double kMaxMatchSeconds = 1.0;

// Expands the 0xFF N C runs of the input format, up to `limit` bytes.
std::string Expand(absl::string_view in, size_t limit) {
  std::string out;
  for (size_t i = 0; i < in.size() && out.size() < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c == 0xFF && i + 2 < in.size()) {
      const size_t count =
          (static_cast<unsigned char>(in[i + 1]) + size_t{1}) * 1024;
      out.append(std::min(count, limit - out.size()), in[i + 2]);
      i += 2;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

// One token of a pattern: a star, or a set of bytes that one character must
// be in (a literal, '?', or a class).
struct Token {
  bool star = false;
  std::bitset<256> accepts;
};

// Reads a class starting at pattern[p] == '['. Grammar (glob.h): [abc],
// ranges [a-z], negation with a leading '!' or '^'. A ']' right after the
// opening (or the negation) is a member; '-' first or last is a member; a
// range whose ends are reversed matches nothing. Returns false if there is
// no closing ']'.
bool ReadClass(absl::string_view pattern, size_t p, Token* token,
               size_t* end) {
  size_t i = p + 1;
  bool negated = false;
  if (i < pattern.size() && (pattern[i] == '!' || pattern[i] == '^')) {
    negated = true;
    ++i;
  }
  std::bitset<256> members;
  bool first = true;
  while (i < pattern.size() && (first || pattern[i] != ']')) {
    first = false;
    const unsigned char lo = static_cast<unsigned char>(pattern[i]);
    unsigned char hi = lo;
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' &&
        pattern[i + 2] != ']') {
      hi = static_cast<unsigned char>(pattern[i + 2]);
      i += 3;
    } else {
      ++i;
    }
    for (unsigned c = lo; c <= hi; ++c) members.set(c);
  }
  if (i >= pattern.size()) return false;
  token->accepts = negated ? ~members : members;
  *end = i + 1;
  return true;
}

// Tokenizes a pattern CheckGlob accepted.
std::vector<Token> Tokenize(absl::string_view pattern) {
  std::vector<Token> tokens;
  for (size_t p = 0; p < pattern.size();) {
    Token token;
    if (pattern[p] == '*') {
      token.star = true;
      ++p;
      // Consecutive stars are one star.
      if (!tokens.empty() && tokens.back().star) continue;
    } else if (pattern[p] == '?') {
      token.accepts.set();
      ++p;
    } else if (pattern[p] == '[') {
      size_t end = 0;
      FUZZ_CHECK(ReadClass(pattern, p, &token, &end))
          << "CheckGlob accepted a pattern with an unterminated class at "
          << p;
      p = end;
    } else {
      token.accepts.set(static_cast<unsigned char>(pattern[p]));
      ++p;
    }
    tokens.push_back(token);
  }
  return tokens;
}

// The reference: matched[j] = the tokens so far match name[0, j).
bool ReferenceMatch(const std::vector<Token>& tokens, absl::string_view name) {
  // Each non-star token takes one character: more of them than characters
  // cannot match (and keeps the table small for long literal patterns).
  size_t fixed = 0;
  for (const Token& token : tokens) fixed += token.star ? 0 : 1;
  if (fixed > name.size()) return false;
  std::vector<char> matched(name.size() + 1, 0);
  matched[0] = 1;
  for (const Token& token : tokens) {
    std::vector<char> next(name.size() + 1, 0);
    if (token.star) {
      bool any = false;
      for (size_t j = 0; j <= name.size(); ++j) {
        any = any || matched[j];
        next[j] = any;
      }
    } else {
      for (size_t j = 0; j < name.size(); ++j) {
        next[j + 1] =
            matched[j] && token.accepts.test(static_cast<unsigned char>(name[j]));
      }
    }
    matched.swap(next);
  }
  return matched[name.size()];
}

// A pattern that matches exactly `name`: special characters as classes.
std::string Quote(absl::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '*' || c == '?' || c == '[') {
      out += '[';
      out += c;
      out += ']';
    } else {
      out += c;
    }
  }
  return out;
}

std::string Show(absl::string_view text) {
  if (text.size() > 200) {
    return absl::StrCat("\"", absl::CHexEscape(text.substr(0, 200)),
                        "\"... (", text.size(), " bytes)");
  }
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer::fuzz;
  namespace init = materializer::init;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string pattern =
      Expand(input.substr(0, split), kMaxPatternBytes);
  const std::string name =
      split == absl::string_view::npos
          ? std::string()
          : Expand(input.substr(split + 1),
                   materializer::spec::kMaxNameLength);

  FUZZ_CHECK(init::GlobMatch("*", name)) << "\"*\" does not match "
                                         << Show(name);
  const std::string quoted = Quote(name);
  if (!quoted.empty() && init::CheckGlob(quoted).ok()) {
    FUZZ_CHECK(init::GlobMatch(quoted, name))
        << Show(quoted) << " does not match " << Show(name);
  }

  const absl::StatusOr<init::Glob> glob = init::Glob::Compile(pattern);
  FUZZ_CHECK(glob.ok() == init::CheckGlob(pattern).ok())
      << "Compile and CheckGlob disagree on " << Show(pattern);
  if (!glob.ok()) {
    FUZZ_CHECK(glob.status().message().size() <= 1024)
        << "a " << glob.status().message().size() << "-byte error for a "
        << pattern.size() << "-byte pattern";
    FUZZ_CHECK(!init::GlobMatch(pattern, name))
        << "a pattern that does not compile matched";
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const bool matched = glob->Matches(name);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  FUZZ_CHECK(matched == init::GlobMatch(pattern, name))
      << "Glob::Matches and GlobMatch disagree on " << Show(pattern) << " vs "
      << Show(name);
  FUZZ_CHECK(seconds < kMaxMatchSeconds)
      << "matching a " << pattern.size() << "-byte pattern against a "
      << name.size() << "-byte name took " << seconds << " s: "
      << Show(pattern) << " vs " << Show(name);
  const bool expected = ReferenceMatch(Tokenize(pattern), name);
  FUZZ_CHECK(matched == expected)
      << "GlobMatch(" << Show(pattern) << ", " << Show(name) << ") is "
      << matched << "; the grammar says " << expected;
  return 0;
}
