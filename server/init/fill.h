#ifndef MATERIALIZER_SERVER_INIT_FILL_H_
#define MATERIALIZER_SERVER_INIT_FILL_H_

// Writes init values into LibTorch tensors: the C++ transcription of each
// torch.nn.init function (same ATen calls in the same order, same scalar
// arithmetic via init_math.h), plus arange and RoPE inverse frequencies,
// and module_default plans. docs/init.md gives the Python expression each
// one equals bit for bit.
//
//   at::Generator g = MakeGenerator(view.device(), DeriveSeed(seed, name));
//   Fill(view, scheme, g);
//
// Parameters must have passed CheckSchemeParameters and
// CheckSchemeForTensor (schemes.h); violations throw c10::Error (callers
// run this under GuardTorch). Thread-compatible: distinct tensors and
// generators may be filled from distinct threads.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "materializer/v1/materializer.pb.h"
#include "server/init/module_plan.h"
#include "server/init/portable/box.h"
#include "server/init/schemes.h"

namespace materializer::init {

// A fresh generator on `device` (torch's CPU generator, or the CUDA
// generator of that device) seeded like Python's Generator.manual_seed.
at::Generator MakeGenerator(const at::Device& device, uint64_t seed);

// Fills `t` in place with `scheme`, as the torch.nn.init call on `t` would:
// `t` may be a view (an init step's region, `t[region]` in Python), and
// random schemes draw exactly as the call on that view draws. Random
// schemes draw from `generator`, which must be on t's device; sparse draws
// its row permutations from the CPU generator `permutations`. values copy
// their bytes. Zero-element tensors are left alone (no draws). Where torch has
// no kernel for the dtype the values are computed in a wider dtype and rounded
// once: float8 through float32 for every scheme, orthogonal through float32 for
// float16 and bfloat16, arange through float64 (int64 for integer dtypes), RoPE
// through float32.
void Fill(at::Tensor& t, const v1::InitScheme& scheme,
          const std::optional<at::Generator>& generator,
          const std::optional<at::Generator>& permutations = std::nullopt);

// Fills `dst`, the part `box` of a tensor of shape `shape` (dst's sizes
// are box.length), with what `scheme` gives those elements of the whole:
// the portable fill of a shard's part of a tensor or init-step region.
// For the schemes that draw nothing (zeros, ones, constant, empty, eye,
// dirac, arange, rope_inv_freq, values); the values equal the same slice
// of Fill on the whole, without computing the whole (rope_inv_freq, whose
// float32 kernels may round differently at different positions, is
// computed for the whole 1-D tensor, at most kMaxRopeFrequencies).
void FillBox(at::Tensor& dst, const v1::InitScheme& scheme,
             const std::vector<int64_t>& shape, const portable::Box& box);

// Runs a module_default plan: every slot in order, drawing from
// `generator` (seeded from the module's name). Written slots fill
// views[slot.tensor]; consumed slots draw into scratch tensors on `device`
// that are dropped at once.
void FillModule(const ModulePlan& plan, std::vector<at::Tensor>& views,
                const at::Device& device, const at::Generator& generator);

// The inverse frequencies of `params` in float32, on the CPU.
at::Tensor RopeInvFreq(const RopeParams& params);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_FILL_H_
