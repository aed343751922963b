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
#include "server/common/cancel.h"
#include "server/spec/tensor_desc.h"

namespace materializer::spec {

inline constexpr int kMaxRank = 16;
inline constexpr size_t kMaxNameLength = 512;
inline constexpr int kMaxTensors = 1000000;
// numel and nbytes must stay below 2^63 (torch sizes are int64).
inline constexpr uint64_t kMaxTensorBytes = (uint64_t{1} << 63) - 1;

// Checks names (non-empty, printable, unique, well-formed components),
// shapes (rank, non-negative sizes, no 63-bit overflow of numel or bytes),
// dtypes and ties (tie_to must name a tensor of the same shape and dtype,
// without cycles; chains resolve to their root in tie_root). Returns the
// tensors in request order. Linear in the request; CANCELLED once
// `cancelled` says the caller is gone (polled between tensors).
absl::StatusOr<std::vector<TensorDesc>> ValidateTensors(
    const v1::ModelSpec& model, const Cancelled& cancelled = {});

// The reason `name` is not an acceptable tensor name, or "" if it is.
std::string NameProblem(absl::string_view name);

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_VALIDATE_H_
