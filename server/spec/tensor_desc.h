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
};

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_TENSOR_DESC_H_
