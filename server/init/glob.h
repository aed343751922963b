#ifndef MATERIALIZER_SERVER_INIT_GLOB_H_
#define MATERIALIZER_SERVER_INIT_GLOB_H_

// Globs over whole tensor names (not path-aware: `*` crosses dots).
//   *        any run of characters, including none
//   ?        exactly one character
//   [abc]    one of a, b, c;  [a-z] a range;  [!abc] / [^abc] negated;
//            a ']' right after '[' (or '[!') is literal: []] matches "]"
// Everything else matches itself.
//
//   ASSIGN_OR_RETURN(Glob bias, Glob::Compile("*.bias"));
//   for (const TensorDesc& t : tensors) if (bias.Matches(t.name)) ...
//
// Compile once per request, match many names. Why this shape: patterns
// come from clients, so matching must not backtrack. A compiled glob is a
// bit-parallel NFA (shift-and): state bit k says "the first k non-star
// items of the pattern match what was read so far", a star is a self-loop
// on its state, and one byte of the name advances every state at once with
// a shift, an AND with the byte's acceptance mask and an OR of the loops.
// So a match reads each byte of the name once, in
// O(|name| * ceil((items + 1) / 64)) word operations, with no dependence
// on how the stars fall; under kMaxPatternBytes that is at most 9 words per
// byte, i.e. linear in the name with a small constant, plus O(|pattern|) to
// compile. Patterns without a star, or a literal with a leading or trailing
// star only ("*.bias", "h.0.*"), are compared directly in O(|pattern|).
// A compiled glob holds 256 masks of ceil((items + 1) / 64) words: 2 KiB
// for a pattern of fewer than 64 items, at most 18 KiB at the limit.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::init {

// Longest pattern accepted (init rules, fetch filters): the longest tensor
// name, so any name can be written literally.
inline constexpr size_t kMaxPatternBytes = 512;

// Immutable once compiled, so thread-safe; copyable and movable.
class Glob {
 public:
  // INVALID_ARGUMENT for an empty pattern, one longer than
  // kMaxPatternBytes, or a '[' without its ']' (the message quotes at most
  // a bounded part of the pattern).
  static absl::StatusOr<Glob> Compile(absl::string_view pattern);

  bool Matches(absl::string_view name) const;

  // The cost of one match per byte of the name, in 64-bit words: what
  // request limits count (docs/api.md).
  int words() const { return words_; }

 private:
  enum class Kind {
    kAll,       // only stars
    kExact,     // a literal, no star
    kPrefix,    // literal then one trailing star
    kSuffix,    // one leading star then a literal
    kAutomaton  // everything else
  };

  Glob() = default;

  Kind kind_ = Kind::kAutomaton;
  // kExact / kPrefix / kSuffix: the literal.
  std::string literal_;
  // kAutomaton: states 0..items, words_ words per state set.
  int words_ = 1;
  int items_ = 0;
  // accept_[c * words_ + w]: bit k + 1 set if item k accepts byte c.
  std::vector<uint64_t> accept_;
  // Bit k set if a star sits at state k (before item k, or after the last).
  std::vector<uint64_t> loops_;
};

// Compiles `pattern` and matches one name: for a single use (tests, one
// off checks). A pattern that does not compile matches nothing.
bool GlobMatch(absl::string_view pattern, absl::string_view name);

// OK, or the INVALID_ARGUMENT Glob::Compile would give.
absl::Status CheckGlob(absl::string_view pattern);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_GLOB_H_
