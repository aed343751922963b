#ifndef MATERIALIZER_SERVER_SPEC_LAYOUT_H_
#define MATERIALIZER_SERVER_SPEC_LAYOUT_H_

// Where each tensor lives inside a handle's arena (one allocation per
// handle). Pure arithmetic: the same on every device.
//
//   ASSIGN_OR_RETURN(Layout layout, ComputeLayout(tensors));
//   // tensors[i] occupies [layout.offsets[i], + tensors[i].nbytes)

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/spec/tensor_desc.h"

namespace materializer::spec {

// Every tensor starts on a 256-byte boundary: enough for any dtype, for
// vectorized CPU kernels (64 B) and for CUDA's allocation granularity, so a
// view is as well aligned as a fresh allocation would be.
inline constexpr uint64_t kArenaAlignment = 256;

struct Layout {
  // Byte offset of each tensor, in request order. A tied tensor has its
  // root's offset.
  std::vector<uint64_t> offsets;
  // Tensor bytes plus padding; what a materialization reserves. The last
  // tensor is padded too, so arenas are multiples of kArenaAlignment.
  uint64_t arena_bytes = 0;
  // Sum of the tensors' nbytes, and their elements; tied tensors count
  // once (as their root).
  uint64_t tensor_bytes = 0;
  uint64_t num_elements = 0;
};

// INVALID_ARGUMENT if the arena would exceed 2^63-1 bytes.
absl::StatusOr<Layout> ComputeLayout(const std::vector<TensorDesc>& tensors);

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_LAYOUT_H_
