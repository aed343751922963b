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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/memory/device.h"
#include "server/memory/pool.h"
#include "server/spec/layout.h"
#include "server/spec/tensor_desc.h"

namespace materializer::memory {

struct ArenaTensors;  // LibTorch views; see arena_views.h

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
      const spec::Layout& layout);

  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  const DeviceConfig& device() const { return device_; }
  uint64_t bytes() const { return bytes_; }
  size_t num_tensors() const;

  // The arena's bytes when they are host memory, else nullptr.
  const std::byte* host_data() const { return host_data_; }

  // Copies arena bytes [offset, offset + length) to host memory at `dst`.
  absl::Status CopyToHost(uint64_t offset, uint64_t length, void* dst) const;

  // The LibTorch views (for server/init); see arena_views.h.
  ArenaTensors& tensors() { return *tensors_; }
  const ArenaTensors& tensors() const { return *tensors_; }

 private:
  Arena(DeviceConfig device, uint64_t bytes);

  // Declared first, so destroyed last: the ledger lets go of the bytes only
  // after the storage is gone.
  Allocation allocation_;
  DeviceConfig device_;
  uint64_t bytes_ = 0;
  std::byte* host_data_ = nullptr;
  std::unique_ptr<ArenaTensors> tensors_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_ARENA_H_
