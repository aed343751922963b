#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_

// RNG_MODE_PORTABLE on LibTorch tensors: maps an init scheme onto the
// portable distributions (server/init/portable) and writes the tensor's
// stored box, on the CPU or on CUDA. Fans, gains and bounds come from the
// FULL shape, so a shard gets exactly its slice of the full tensor.
// Deterministic schemes (zeros, ones, constant, empty) are plain fills;
// eye, dirac, arange and rope_inv_freq of a shard are computed for the full
// tensor and sliced.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Fills `view` (desc's stored tensor) with `scheme`, one of the schemes
// that have a portable definition (not orthogonal, sparse or
// module_default: callers expand a module default into its per-tensor
// scheme). `threads` is the CPU kernel's thread budget. Throws on failure
// (run under GuardTorch).
void FillPortableTensor(at::Tensor& view, const spec::TensorDesc& desc,
                        const v1::InitScheme& scheme, uint64_t seed,
                        int threads);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_
