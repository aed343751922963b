#include "server/service/published_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"

namespace materializer::service {
namespace {

// A new memory file holding `contents`, modified at `mtime`; -1 and errno
// on failure.
int MakeVersion(const std::string& name, absl::string_view contents,
                int64_t mtime) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n =
        ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      return -1;
    }
    written += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{static_cast<time_t>(mtime), 0},
                                    {static_cast<time_t>(mtime), 0}};
  if (::futimens(fd, times) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PublishedFile>> PublishedFile::Create(
    absl::string_view name, absl::string_view contents) {
  const int64_t mtime = static_cast<int64_t>(::time(nullptr));
  std::string memfd_name(name);
  const int fd = MakeVersion(memfd_name, contents, mtime);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("creating the in-memory file ", name));
  }
  return std::unique_ptr<PublishedFile>(
      new PublishedFile(std::move(memfd_name), fd, mtime));
}

PublishedFile::PublishedFile(std::string name, int fd, int64_t mtime)
    : name_(std::move(name)),
      fd_(fd),
      path_(absl::StrCat("/proc/self/fd/", fd)),
      mtime_(mtime) {}

PublishedFile::~PublishedFile() { ::close(fd_); }

absl::Status PublishedFile::Replace(absl::string_view contents) {
  absl::MutexLock lock(&mu_);
  const int64_t mtime =
      std::max(static_cast<int64_t>(::time(nullptr)), mtime_ + 1);
  const int fd = MakeVersion(name_, contents, mtime);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("creating the in-memory file ", name_));
  }
  // One step: a reader opening path_ gets the old file or the new one.
  const int moved = ::dup3(fd, fd_, O_CLOEXEC);
  const int saved = errno;
  ::close(fd);
  if (moved < 0) {
    return absl::ErrnoToStatus(
        saved, absl::StrCat("replacing the in-memory file ", name_));
  }
  mtime_ = mtime;
  return absl::OkStatus();
}

}  // namespace materializer::service
