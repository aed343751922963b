#ifndef MATERIALIZER_SERVER_SPEC_VALIDATE_H_
#define MATERIALIZER_SERVER_SPEC_VALIDATE_H_

// Validation of the tensor list of a ModelSpec. Init rules are checked by
// server/init, which owns the schemes.
//
//   ASSIGN_OR_RETURN(std::vector<TensorDesc> tensors,
//                    ValidateTensors(request.model()));
//
// Errors are INVALID_ARGUMENT and name the field path and the tensor:
//   model.tensors[3] ("h.0.attn.weight"): shape[1] is -4; sizes must be >= 0

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/limits.h"
#include "server/spec/tensor_desc.h"

namespace materializer::spec {

// Checks that the model has tensors, names (non-empty, printable ASCII
// without spaces, quotes or backslashes, unique, well-formed components),
// shapes (rank, non-negative sizes, no 63-bit overflow of numel, bytes or
// strides), dtypes and ties (tie_to must name a tensor of the same shape and
// dtype, without cycles; chains resolve to their root in tie_root). Returns the
// tensors in request order.
absl::StatusOr<std::vector<TensorDesc>> ValidateTensors(
    const v1::ModelSpec& model);

// The reason `name` is not an acceptable tensor name, or "" if it is.
std::string NameProblem(absl::string_view name);

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_VALIDATE_H_
