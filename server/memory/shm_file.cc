#include "server/memory/shm_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

constexpr long kTmpfsMagic = 0x01021994;  // statfs f_type of tmpfs

// /proc/self/mountinfo writes a space, tab, newline or backslash in a path
// as a backslash and three octal digits.
std::string UnescapeMountPath(absl::string_view escaped) {
  auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string path;
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] == '\\' && i + 3 < escaped.size() &&
        octal(escaped[i + 1]) && octal(escaped[i + 2]) &&
        octal(escaped[i + 3])) {
      path.push_back(static_cast<char>((escaped[i + 1] - '0') * 64 +
                                       (escaped[i + 2] - '0') * 8 +
                                       (escaped[i + 3] - '0')));
      i += 3;
    } else {
      path.push_back(escaped[i]);
    }
  }
  return path;
}

bool MountCovers(absl::string_view mount_point, absl::string_view path) {
  if (mount_point == "/") return true;
  return absl::StartsWith(path, mount_point) &&
         (path.size() == mount_point.size() ||
          path[mount_point.size()] == '/');
}

// The bracketed choice of a sysfs setting ("always [never] ..."), or "".
std::string SelectedSetting(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

}  // namespace

absl::StatusOr<SharedMemoryDirInfo> InspectSharedMemoryDir(
    const std::string& dir) {
  char resolved[PATH_MAX];
  struct stat st;
  if (realpath(dir.c_str(), resolved) == nullptr ||
      stat(resolved, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory directory ", dir, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory directory ", dir, ": not a directory"));
  }
  struct statfs fs;
  if (statfs(resolved, &fs) != 0 ||
      static_cast<long>(fs.f_type) != kTmpfsMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory directory ", dir,
        ": not on a tmpfs (its files would be written to a disk)"));
  }
  if (access(resolved, W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory directory ", dir, ": cannot create files there: ",
        std::strerror(errno)));
  }
  SharedMemoryDirInfo info;
  info.capacity_bytes =
      static_cast<uint64_t>(fs.f_blocks) * static_cast<uint64_t>(fs.f_bsize);
  // The mount holding the directory: the longest mount point that covers
  // it, the later line winning (a mount over an earlier one).
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t dash = 0;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (fields.size() < 5 || dash + 3 >= fields.size()) continue;
    const std::string mount_point = UnescapeMountPath(fields[4]);
    if (!MountCovers(mount_point, resolved) ||
        mount_point.size() < info.mount_point.size()) {
      continue;
    }
    info.mount_point = mount_point;
    info.huge = "never";
    if (fields[dash + 1] != "tmpfs") continue;
    for (absl::string_view option : absl::StrSplit(fields[dash + 3], ',')) {
      if (absl::ConsumePrefix(&option, "huge=")) info.huge = std::string(option);
    }
  }
  const std::string system_wide =
      SelectedSetting("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  if (system_wide == "deny" || system_wide == "force") info.huge = system_wide;
  // Not "advise": the server does not advise (MADV_HUGEPAGE would make a
  // fault wait for compaction under the usual THP defrag setting;
  // docs/architecture.md, "Host memory"). Without the advice a huge page
  // is taken when one is free, and 4 KiB pages otherwise.
  info.huge_pages = info.huge == "always" || info.huge == "within_size" ||
                    info.huge == "force";
  return info;
}

std::byte* ReserveAddressSpace(uint64_t bytes) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (bytes < kHugePageBytes) {
    void* range = mmap(nullptr, bytes, PROT_NONE, flags, -1, 0);
    return range == MAP_FAILED ? nullptr : static_cast<std::byte*>(range);
  }
  // Reserve a huge page more than asked, then give back the ends that lie
  // outside the aligned range.
  const uint64_t padded = bytes + kHugePageBytes;
  void* range = mmap(nullptr, padded, PROT_NONE, flags, -1, 0);
  if (range == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(range);
  const uintptr_t aligned =
      (start + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  if (aligned > start) munmap(range, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes) {
    munmap(reinterpret_cast<void*>(aligned + bytes), end - (aligned + bytes));
  }
  return reinterpret_cast<std::byte*>(aligned);
}

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
