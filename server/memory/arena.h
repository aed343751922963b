#ifndef MATERIALIZER_SERVER_MEMORY_ARENA_H_
#define MATERIALIZER_SERVER_MEMORY_ARENA_H_

// One allocation per handle; every tensor of the handle is a view into it.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Arena> arena,
//                    Arena::Allocate(std::move(reservation), tensors, layout));
//   // arena->... tensors exist with to_empty semantics: real storage, not
//   // yet initialized (server/init writes every one of them).
//
// The arena owns the ledger entry for its bytes (an Allocation), so memory
// and accounting are freed together, when the arena is destroyed.
//
// Zero-copy export (docs/delivery.md): a CPU arena allocated with
// ArenaOptions::shared_memory lives in 0600 files under /dev/shm with
// unguessable names (one, or several taken from a SharedMemoryPool, mapped
// back to back), which a co-located process maps; a CUDA arena is its own
// cudaMalloc allocation, so its IPC handle covers exactly the arena.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/memory/device.h"
#include "server/memory/pool.h"
#include "server/memory/shm_pool.h"
#include "server/spec/layout.h"
#include "server/spec/tensor_desc.h"

namespace materializer::memory {

struct ArenaTensors;  // LibTorch views; see arena_views.h

struct ArenaOptions {
  // CPU arenas: back the arena with a file under /dev/shm (created O_EXCL,
  // mode 0600, a 128-bit random name), so that it can be exported. Ignored
  // for CUDA arenas, which can always be exported through CUDA IPC.
  bool shared_memory = false;
  // Where the files go; tests point it elsewhere.
  std::string shared_memory_dir = "/dev/shm";
  // Resident files to build the arena from (and their directory, which
  // then replaces shared_memory_dir); fresh pages make up the rest.
  SharedMemoryPool* shared_memory_pool = nullptr;
};

// One file of a shared-memory arena: arena bytes [offset, offset + bytes)
// are the file's bytes [0, bytes).
struct SharedMemorySegment {
  std::string path;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// What an importer needs to open a CUDA arena (CudaIpcExport).
struct CudaIpcInfo {
  std::array<char, 64> ipc_handle{};  // cudaIpcMemHandle_t
  int device_ordinal = 0;
  std::string device_uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  uint64_t base_offset = 0;
};

// The UUID ("GPU-...") of CUDA device `ordinal`; UNAVAILABLE without a
// CUDA driver.
absl::StatusOr<std::string> CudaDeviceUuid(int ordinal);

// Immutable after Allocate() except for the tensor contents, which only the
// init step writes (before the arena is shared). Reading concurrently is
// safe.
class Arena {
 public:
  // Allocates layout.arena_bytes on the reservation's device and creates
  // one view per tensor (shape, dtype and offset from the layout). CPU
  // arenas are fresh anonymous pages (zero-filled by the kernel, never
  // another client's bytes); CUDA arenas come from LibTorch's allocator.
  // RESOURCE_EXHAUSTED if the device cannot provide the memory; the
  // reservation is then dropped, which rolls the ledger back.
  static absl::StatusOr<std::unique_ptr<Arena>> Allocate(
      Reservation reservation, const std::vector<spec::TensorDesc>& tensors,
      const spec::Layout& layout, const ArenaOptions& options = {});

  // One arena over `parts` (a handle split across devices, one part per
  // device): part p holds arena bytes [bases[p], bases[p] + its bytes),
  // and tensor i is view `local_index[i]` of part `part_of_tensor[i]`.
  // The combined arena has no host_data() (reads go through CopyToHost,
  // part by part), no shared memory and no IPC handle; device() is the
  // first part's.
  static std::unique_ptr<Arena> Combine(
      std::vector<std::unique_ptr<Arena>> parts, std::vector<uint64_t> bases,
      const std::vector<int>& part_of_tensor,
      const std::vector<int>& local_index);

  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  const DeviceConfig& device() const { return device_; }
  // The device of arena byte `offset` (a part's, for a combined arena).
  const DeviceConfig& DeviceAt(uint64_t offset) const;
  size_t num_parts() const { return parts_.empty() ? 1 : parts_.size(); }
  uint64_t bytes() const { return bytes_; }
  size_t num_tensors() const;

  // The arena's bytes when they are host memory, else nullptr.
  const std::byte* host_data() const { return host_data_; }

  // Copies arena bytes [offset, offset + length) to host memory at `dst`.
  absl::Status CopyToHost(uint64_t offset, uint64_t length, void* dst) const;

  // The /dev/shm files holding a shared-memory CPU arena, in arena order
  // (covering it back to back), else empty. Still reported after
  // UnlinkSharedMemory.
  const std::vector<SharedMemorySegment>& shared_memory_segments() const {
    return shm_segments_;
  }
  bool shared_memory() const { return !shm_segments_.empty(); }
  bool shared_memory_linked() const {
    return !shm_segments_.empty() && !shm_unlinked_.load();
  }
  // Removes the /dev/shm names (idempotent, thread-safe). Mappings made
  // before stay valid; the pages go when the last mapping goes. The
  // destructor does it too.
  void UnlinkSharedMemory() const;

  // CUDA arenas: the IPC handle of the arena's allocation.
  // FAILED_PRECONDITION for host arenas, or a CUDA arena that is not an
  // allocation of its own.
  absl::StatusOr<CudaIpcInfo> ExportCudaIpc() const;

  // The LibTorch views (for server/init); see arena_views.h.
  ArenaTensors& tensors() { return *tensors_; }
  const ArenaTensors& tensors() const { return *tensors_; }

 private:
  friend class HostStaging;
  Arena(DeviceConfig device, uint64_t bytes);

  // Declared first, so destroyed last: the ledger lets go of the bytes only
  // after the storage is gone.
  Allocation allocation_;
  DeviceConfig device_;
  uint64_t bytes_ = 0;
  std::byte* host_data_ = nullptr;
  // CUDA arenas allocated by cudaMalloc here (not LibTorch's cache).
  void* cuda_data_ = nullptr;
  // Shared-memory CPU arenas: the files, and their descriptors (held with
  // a shared flock, which marks a file as live for stale-file cleanup).
  std::vector<SharedMemorySegment> shm_segments_;
  std::vector<int> shm_fds_;
  mutable std::atomic<bool> shm_unlinked_{false};
  std::unique_ptr<ArenaTensors> tensors_;
  // A combined arena: its parts (which own the memory and the ledger
  // entries) and where each starts.
  std::vector<std::unique_ptr<Arena>> parts_;
  std::vector<uint64_t> part_bases_;
};

// Device-to-host copies of a CUDA arena through two pinned host buffers on
// a stream of their own: Prefetch starts the copy of the next range while
// the caller sends the previous one, CopyOut waits for it (or copies now)
// and hands the bytes out. Thread-compatible. The arena must outlive it.
class HostStaging {
 public:
  // UNAVAILABLE for host arenas or where the CUDA runtime is not loaded.
  static absl::StatusOr<std::unique_ptr<HostStaging>> Create(
      const Arena& arena, uint64_t buffer_bytes);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  uint64_t buffer_bytes() const { return buffer_bytes_; }

  // Starts copying arena bytes [offset, offset + length) (length <=
  // buffer_bytes()) into a pinned buffer. A no-op while a prefetch is in
  // flight.
  absl::Status Prefetch(uint64_t offset, uint64_t length);
  // Copies arena bytes [offset, offset + length) to `dst`: from the
  // prefetched buffer when it holds that range, else through the other
  // buffer now.
  absl::Status CopyOut(uint64_t offset, uint64_t length, void* dst);

 private:
  struct Impl;
  explicit HostStaging(std::unique_ptr<Impl> impl, uint64_t buffer_bytes);
  std::unique_ptr<Impl> impl_;
  uint64_t buffer_bytes_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_ARENA_H_
