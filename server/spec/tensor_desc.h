#ifndef MATERIALIZER_SERVER_SPEC_TENSOR_DESC_H_
#define MATERIALIZER_SERVER_SPEC_TENSOR_DESC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/spec/dtype.h"

namespace materializer::spec {

// One validated tensor of a meta module: everything a meta tensor knows
// (name, shape, dtype) plus the module facts from the request. Sizes are
// known to be non-negative and numel/nbytes to fit in 63 bits.
struct TensorDesc {
  std::string name;
  // The shape of what is stored: the full tensor's, or the shard's.
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  bool is_buffer = false;
  // Part of the state_dict (always true for parameters).
  bool persistent = true;
  std::string module_type;
  uint64_t numel = 0;
  uint64_t nbytes = 0;
  // Tied weights: index (in the model's tensor list) of the root tensor
  // whose storage this one shares, or -1. A tied tensor has no init of its
  // own and no bytes of its own in the arena.
  int tie_root = -1;
  // A shard (TensorSpec.shard): the full tensor's shape, and where the
  // stored box starts in it. Both empty for a whole tensor.
  std::vector<int64_t> shard_full_shape;
  std::vector<int64_t> shard_offset;

  bool is_shard() const { return !shard_full_shape.empty(); }
  // The tensor's logical shape (the full one for a shard): what fans,
  // bounds and shape checks of init schemes are computed from.
  const std::vector<int64_t>& full_shape() const {
    return is_shard() ? shard_full_shape : shape;
  }
  // Elements of the full tensor (numel for a whole tensor). Validation
  // keeps every decision about values on the full tensor, so an empty shard
  // is checked like any other shard.
  uint64_t full_numel() const {
    if (!is_shard()) return numel;
    uint64_t n = 1;
    for (int64_t size : shard_full_shape) n *= static_cast<uint64_t>(size);
    return n;
  }
};

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_TENSOR_DESC_H_
