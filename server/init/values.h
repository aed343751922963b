#ifndef MATERIALIZER_SERVER_INIT_VALUES_H_
#define MATERIALIZER_SERVER_INIT_VALUES_H_

// Literal values (InitScheme.values): element bytes a client computed and
// sends, little-endian in the tensor's dtype, row-major over what the
// scheme fills (the whole tensor, or an init step's region; a shard still
// sends the whole, and the server takes its part).
//
//   RETURN_IF_ERROR(CheckValues(values, target));
//
// Values are written as sent, bit for bit, with two exceptions refused
// here: a bool byte other than 0 or 1 (torch's bool is one byte holding 0
// or 1; anything else reads differently on different paths), and NaN in a
// floating dtype (never a meaningful init value, and most often a bug in
// the client's computation). Infinities are accepted: -inf is how additive
// attention masks are written, and such buffers are created in module
// constructors.
//
// Thread-safe: pure functions. No LibTorch.

#include <cstdint>

#include "absl/status/status.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Checks `values` against `target` (its full shape and dtype): exactly
// full_numel() x item size bytes, bools 0 or 1, no NaN. INVALID_ARGUMENT
// with the reason, e.g. "values.data has 10 bytes; shape [2, 2] of float32
// needs 16 (4 elements x 4 bytes)".
absl::Status CheckValues(const v1::Values& values,
                         const spec::TensorDesc& target);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_VALUES_H_
