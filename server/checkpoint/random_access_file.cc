#include "server/checkpoint/random_access_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace materializer::checkpoint {
namespace {

absl::Status CheckRange(uint64_t offset, uint64_t length, uint64_t size) {
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("read of bytes [", offset, ", +", length,
                     ") passes the end of a ", size, "-byte file"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadBytes(const RandomAccessFile& file,
                                      uint64_t offset, uint64_t length) {
  if (absl::Status s = CheckRange(offset, length, file.size()); !s.ok()) {
    return s;
  }
  std::string out(length, '\0');
  if (absl::Status s = file.ReadAt(offset, length, out.data()); !s.ok()) {
    return s;
  }
  return out;
}

absl::Status FdFile::ReadAt(uint64_t offset, uint64_t length,
                            char* dst) const {
  if (absl::Status s = CheckRange(offset, length, size_); !s.ok()) {
    return absl::OutOfRangeError(absl::StrCat(label_, ": ", s.message()));
  }
  uint64_t done = 0;
  while (done < length) {
    // pread takes at most SSIZE_MAX; Linux returns at most ~2 GiB anyway.
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(length - done, 1u << 30));
    const ssize_t n = pread(fd_, dst + done, chunk,
                            static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(
          errno, absl::StrCat(label_, ": reading bytes [", offset + done,
                              ", +", length - done, ")"));
    }
    if (n == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          label_, " changed on disk while being read: it ended at byte ",
          offset + done, ", before its size of ", size_, " bytes when opened"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status StringFile::ReadAt(uint64_t offset, uint64_t length,
                                char* dst) const {
  if (absl::Status s = CheckRange(offset, length, bytes_.size()); !s.ok()) {
    return s;
  }
  if (length > 0) std::memcpy(dst, bytes_.data() + offset, length);
  return absl::OkStatus();
}

}  // namespace materializer::checkpoint
