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
};

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_TENSOR_DESC_H_
