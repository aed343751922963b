#ifndef MATERIALIZER_SERVER_COMMON_QUOTE_H_
#define MATERIALIZER_SERVER_COMMON_QUOTE_H_

// Client input echoed in error messages, bounded. A status message travels
// in a gRPC trailer, and gRPC refuses trailers over its metadata limit
// (16 KiB hard, 8 KiB soft by default), so an error that quoted a 1 MB
// handle id in full would reach the client as RESOURCE_EXHAUSTED instead of
// the error itself. Every input a message echoes goes through Quote.
//
//   return absl::NotFoundError(absl::StrCat("handle ", Quote(id), " not found"));
//   // handle "h-0000...0000" (1048578 bytes) not found

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace materializer {

// Most bytes of an input Quote shows.
inline constexpr size_t kMaxQuotedBytes = 128;

// `input` in double quotes, with C escapes for quotes, backslashes and
// bytes outside printable ASCII; if it is longer than `max_bytes`, its first
// `max_bytes` bytes, "...", and its length: "abc..." (1048576 bytes).
std::string Quote(absl::string_view input, size_t max_bytes = kMaxQuotedBytes);

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_QUOTE_H_
