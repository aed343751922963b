#ifndef MATERIALIZER_SERVER_INIT_GLOB_H_
#define MATERIALIZER_SERVER_INIT_GLOB_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace materializer::init {

// Glob over a whole tensor name (not path-aware: `*` crosses dots).
//   *        any run of characters, including none
//   ?        exactly one character
//   [abc]    one of a, b, c;  [a-z] a range;  [!abc] / [^abc] negated
// Everything else matches itself. Runs in O(pattern * name) time.
bool GlobMatch(absl::string_view pattern, absl::string_view name);

// OK, or INVALID_ARGUMENT saying what is wrong (empty pattern, an
// unterminated or empty [class]).
absl::Status CheckGlob(absl::string_view pattern);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_GLOB_H_
