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

// Removes this user's `materializer-*` files under `dir` that no live
// process holds and that are older than a minute (a crashed server's
// leftovers). Once per directory per process.
void SweepStaleFiles(const std::string& dir);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_SHM_FILE_H_
