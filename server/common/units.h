#ifndef MATERIALIZER_SERVER_COMMON_UNITS_H_
#define MATERIALIZER_SERVER_COMMON_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer {

// Parses a byte count: "1048576", "512MiB", "16GiB", "1.5GB", "64KiB".
// Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes; "B"
// optional. INVALID_ARGUMENT on anything else or on overflow.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// "0 B", "1023 B", "1.00 KiB", "123.46 MiB", ...
std::string FormatBytes(uint64_t bytes);

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_UNITS_H_
