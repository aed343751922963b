#include "server/common/random_hex.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace materializer {

std::string UnguessableHex128() {
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();
    }
    filled += static_cast<size_t>(n);
  }
  std::string out;
  out.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    absl::StrAppend(&out, absl::Hex(b, absl::kZeroPad2));
  }
  return out;
}

}  // namespace materializer
