#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_

// RNG_MODE_PORTABLE on LibTorch tensors: maps an init step onto the
// portable distributions (server/init/portable) and writes the part of it
// that a tensor's stored box holds, on the CPU or on CUDA. A step fills its
// region (a box of the full tensor, or all of it) as a tensor of its own:
// elements are numbered, and fans computed, within the region; the key is
// the tensor's, the stream the step's index (docs/portable-rng.md,
// "Init steps"). So a shard gets exactly its slice of the full tensor, step
// by step. Schemes that draw nothing are written for the part directly
// (FillBox), never for the whole tensor.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "materializer/v1/materializer.pb.h"
#include "server/init/portable/box.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Writes init step `step` (`scheme` over `region`, none for the whole
// tensor) into `view`, desc's stored tensor (the whole, or a shard's box),
// where the two meet. `scheme` is one with a portable definition (not
// orthogonal, sparse or module_default: callers expand a module default
// into its per-tensor scheme). `threads` is the CPU kernel's thread
// budget. Throws on failure (run under GuardTorch).
void FillPortableStep(at::Tensor& view, const spec::TensorDesc& desc,
                      const v1::InitScheme& scheme,
                      const std::optional<portable::Box>& region, uint32_t step,
                      uint64_t seed, int threads);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_FILL_H_
