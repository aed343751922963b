#ifndef MATERIALIZER_SERVER_INIT_SHARD_H_
#define MATERIALIZER_SERVER_INIT_SHARD_H_

// Shards: a TensorSpec may ask for a sub-box of its tensor. The stored
// tensor is then the box (TensorDesc::shape), and its full shape and offset
// are kept for the values: in RNG_MODE_PORTABLE an element's value depends
// on its index in the full tensor, so a shard's bytes equal the same slice
// of the full tensor.
//
//   RETURN_IF_ERROR(ApplyShards(model, rng, tensors));  // after validation

#include <vector>

#include "absl/status/status.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// For every tensor with a shard: checks it (RNG_MODE_PORTABLE only; box
// xor split; ranges inside the shape; no ties) and turns the tensor into
// its box. INVALID_ARGUMENT naming the tensor and the reason.
absl::Status ApplyShards(const v1::ModelSpec& model, v1::RngMode rng,
                         std::vector<spec::TensorDesc>& tensors);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_SHARD_H_
