#include "server/memory/shm_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/common/random_hex.h"
#include "server/common/units.h"

namespace materializer::memory {
namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

// Pieces one populate call covers: large enough that the syscalls do not
// count, small enough that the threads finish together.
constexpr uint64_t kPopulateChunk = uint64_t{64} << 20;

constexpr char kShmPrefix[] = "materializer-";
// Files older than this that no live server holds are leftovers of a
// crash and are removed (the age keeps a concurrently starting server's
// fresh file safe between its create and its flock).
constexpr absl::Duration kStaleAge = absl::Minutes(1);

}  // namespace

absl::StatusOr<bool> PopulateForWrite(std::byte* pages, uint64_t bytes,
                                      int threads, absl::string_view what) {
  if (bytes == 0) return true;
  const uint64_t chunks = (bytes + kPopulateChunk - 1) / kPopulateChunk;
  std::atomic<uint64_t> next{0};
  std::atomic<int> error{0};
  auto run = [&] {
    for (uint64_t c = next++; c < chunks && error.load() == 0; c = next++) {
      const uint64_t begin = c * kPopulateChunk;
      const uint64_t length = std::min(kPopulateChunk, bytes - begin);
      if (madvise(pages + begin, length, MADV_POPULATE_WRITE) != 0) {
        int expected = 0;
        error.compare_exchange_strong(expected, errno);
      }
    }
  };
  threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(threads, static_cast<int64_t>(chunks))));
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(run);
  run();
  for (std::thread& helper : helpers) helper.join();
  switch (error.load()) {
    case 0:
      return true;
    case EINVAL:  // an older kernel: the pages come on first write
      return false;
    default:  // EFAULT (a full /dev/shm would SIGBUS), ENOMEM, EINTR, ...
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot make ", FormatBytes(bytes), " of ", what,
          " resident: ", std::strerror(error.load())));
  }
}

void SweepStaleFiles(const std::string& dir) {
  static std::mutex mu;
  static std::vector<std::string>* swept = new std::vector<std::string>;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const std::string& done : *swept) {
      if (done == dir) return;
    }
    swept->push_back(dir);
  }
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return;
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  while (const dirent* entry = readdir(listing)) {
    if (!absl::StartsWith(entry->d_name, kShmPrefix)) continue;
    const std::string path = absl::StrCat(dir, "/", entry->d_name);
    const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
        now - st.st_mtime > absl::ToInt64Seconds(kStaleAge) &&
        flock(fd, LOCK_EX | LOCK_NB) == 0) {
      MLOG(WARNING) << "removing " << path
                    << ": a shared-memory arena no live server holds";
      unlink(path.c_str());
    }
    close(fd);
  }
  closedir(listing);
}

absl::StatusOr<SharedMemoryFile> CreateSharedMemoryFile(const std::string& dir,
                                                        uint64_t bytes) {
  SweepStaleFiles(dir);
  SharedMemoryFile file;
  file.path = absl::StrCat(dir, "/", kShmPrefix, UnguessableHex128());
  file.fd = open(file.path.c_str(),
                 O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (file.fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot create shared memory ", file.path, ": ",
        std::strerror(errno)));
  }
  // The umask may have cleared bits of 0600 but never adds any; make it
  // exactly owner read-write.
  if (fchmod(file.fd, 0600) != 0 || flock(file.fd, LOCK_SH) != 0) {
    const int error = errno;
    CloseSharedMemoryFile(file);
    return absl::InternalError(
        absl::StrCat("preparing ", file.path, ": ", std::strerror(error)));
  }
  if (bytes > 0 && ftruncate(file.fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    const std::string path = file.path;
    CloseSharedMemoryFile(file);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot size ", path, " to ", FormatBytes(bytes), ": ",
        std::strerror(error)));
  }
  return file;
}

void CloseSharedMemoryFile(SharedMemoryFile& file, bool unlink_path) {
  if (unlink_path && !file.path.empty() && unlink(file.path.c_str()) != 0 &&
      errno != ENOENT) {
    MLOG(WARNING) << "unlink " << file.path << ": " << std::strerror(errno);
  }
  if (file.fd >= 0) close(file.fd);
  file.fd = -1;
}

}  // namespace materializer::memory
