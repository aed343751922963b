#ifndef MATERIALIZER_SERVER_INIT_APPLY_H_
#define MATERIALIZER_SERVER_INIT_APPLY_H_

// Writes every tensor of a freshly allocated arena with its resolved init.
//
// RNG_MODE_PORTABLE (the default) fills each tensor's stored box with the
// counter-based generator of server/init/portable: values depend only on
// (seed, name, init step, index in the step's region); tensors run one
// after another, each split across every thread. The rest of this comment is
// torch mode.
//
//   RETURN_IF_ERROR(ApplyInits(tensors, resolution.inits, seed, rng, *arena));
//
// Random schemes in RNG_MODE_TORCH use one generator per tensor, seeded
// with DeriveSeed(seed, name), on the arena's device, so values equal
// Python's `torch.nn.init.<scheme>_(t, ..., generator=g)` bit for bit; a
// tensor's init steps run in order on that generator, each on the view
// t[region] (docs/init.md, "Init steps").
// module_default tensors use one generator per module, seeded with
// DeriveSeed(seed, module name), drawn in reset_parameters() order. Tied
// tensors are skipped (their root is written). Tasks (a tensor, or a
// module) are independent, so they run in parallel, largest first, on up to
// at::get_num_threads() threads; LibTorch kernels inside a task run on one
// thread (OpenMP and MKL), which keeps LAPACK-based schemes (orthogonal)
// reproducible.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/resolve.h"
#include "server/init/rng_mode.h"
#include "server/memory/arena.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {


// `cancelled`, when set, is polled between tasks: once it returns true no
// further task starts and the result is CANCELLED (the caller then drops the
// arena).
absl::Status ApplyInits(const std::vector<spec::TensorDesc>& tensors,
                        const std::vector<ResolvedInit>& inits, uint64_t seed,
                        v1::RngMode rng, memory::Arena& arena,
                        const std::function<bool()>& cancelled = nullptr);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_APPLY_H_
