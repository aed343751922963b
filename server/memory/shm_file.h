#ifndef MATERIALIZER_SERVER_MEMORY_SHM_FILE_H_
#define MATERIALIZER_SERVER_MEMORY_SHM_FILE_H_

// The files behind shared-memory arenas, and making pages resident.
//
//   ASSIGN_OR_RETURN(SharedMemoryFile file,
//                    CreateSharedMemoryFile("/dev/shm", bytes));
//   // mmap(file.fd, MAP_SHARED) ... PopulateForWrite(...)
//   CloseSharedMemoryFile(file);   // unlinks and closes
//
// Every file is `<dir>/materializer-<128 random bits in hex>`, created
// O_EXCL with mode 0600, and held with a shared flock for as long as this
// process owns it: SweepStaleFiles removes only files no live process
// holds (what a crashed server leaves behind). No LibTorch here.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::memory {

// Makes [pages, pages + bytes) resident and writable now, with
// MADV_POPULATE_WRITE in 64 MiB pieces on `threads` threads, instead of
// one page fault at a time while init writes it. Allocating and zeroing a
// page is the kernel's work either way; done here it is batched (no trap
// per page), and a shortage is RESOURCE_EXHAUSTED now instead of a SIGBUS
// (shared memory) or the OOM killer (anonymous) later
// (docs/architecture.md, "Host memory"). Returns false where the kernel has
// no MADV_POPULATE_WRITE (before 5.14): nothing was done.
absl::StatusOr<bool> PopulateForWrite(std::byte* pages, uint64_t bytes,
                                      int threads, absl::string_view what);

// A file of this process under a shared-memory directory.
struct SharedMemoryFile {
  std::string path;
  int fd = -1;  // O_RDWR, holding LOCK_SH
};

// A fresh file of `bytes` (ftruncate: no pages yet) under `dir`. Sweeps
// `dir` of stale files first (once per directory per process).
// RESOURCE_EXHAUSTED when the file cannot be created or sized.
absl::StatusOr<SharedMemoryFile> CreateSharedMemoryFile(const std::string& dir,
                                                        uint64_t bytes);

// Unlinks the file's name (if `unlink_path`) and closes its descriptor.
// Mappings stay valid; the pages go when the last mapping goes.
void CloseSharedMemoryFile(SharedMemoryFile& file, bool unlink_path = true);

// What backs the files of a shared-memory directory.
struct SharedMemoryDirInfo {
  std::string mount_point;  // of the tmpfs holding the directory
  // The mount's huge= option ("never" when it has none), or the kernel's
  // system-wide override ("deny", "force": transparent_hugepage/
  // shmem_enabled).
  std::string huge = "never";
  // Whether files there get 2 MiB pages: a fresh 2 MiB page costs about
  // what eight fresh 4 KiB pages do (0.38 against 2-3 us per 4 KiB on the
  // 2-core VM), and it is mapped with one page-table entry instead of 512.
  bool huge_pages = false;
  // The tmpfs's size (its size= option, half of RAM by default).
  uint64_t capacity_bytes = 0;
};

// Checks that `dir` is a directory on a tmpfs (memory, not disk) that
// this process can create files in, and reads its huge-page policy from
// /proc/self/mountinfo. INVALID_ARGUMENT naming the directory otherwise.
absl::StatusOr<SharedMemoryDirInfo> InspectSharedMemoryDir(
    const std::string& dir);

// Size of a huge page of tmpfs (PMD) on x86-64 and arm64 with 4 KiB pages.
inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// Reserves `bytes` (a multiple of the page size) of address space,
// PROT_NONE, for files to be mapped over with MAP_FIXED; a range of at
// least kHugePageBytes starts on a kHugePageBytes boundary, so that a file
// offset that is a multiple of 2 MiB lands on a 2 MiB address and a
// huge-page tmpfs can map it with 2 MiB entries (a misaligned mapping gets
// 4 KiB pages, even in such a tmpfs). Null when the address space is
// exhausted (errno set); release with munmap(result, bytes).
std::byte* ReserveAddressSpace(uint64_t bytes);

// Removes this user's `materializer-*` files under `dir` that no live
// process holds and that are older than a minute (a crashed server's
// leftovers). Once per directory per process.
void SweepStaleFiles(const std::string& dir);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_SHM_FILE_H_
