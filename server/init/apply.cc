#include "server/init/apply.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/empty.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/torch_guard.h"
#include "server/init/schemes.h"
#include "server/init/seed.h"
#include "server/memory/arena_views.h"

namespace materializer::init {
namespace {

at::Generator MakeGenerator(const at::Device& device, uint64_t seed) {
  at::Generator generator =
      device.is_cuda()
          ? at::detail::getCUDAHooks().getNewGenerator(device.index())
          : at::make_generator<at::CPUGeneratorImpl>();
  // The same call Python's Generator.manual_seed makes.
  generator.set_current_seed(seed);
  return generator;
}

// Fills `t` in place. Mirrors torch.nn.init: zeros_ -> zero_(),
// ones_ -> fill_(1), constant_ -> fill_(val), uniform_ -> uniform_(a, b, g),
// normal_ -> normal_(mean, std, g).
void Fill(at::Tensor& t, const v1::InitScheme& scheme,
          const std::optional<at::Generator>& generator) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kZeros:
      t.zero_();
      return;
    case v1::InitScheme::kOnes:
      t.fill_(1);
      return;
    case v1::InitScheme::kConstant:
      t.fill_(scheme.constant().val());
      return;
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      t.uniform_(p.a, p.b, generator);
      return;
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      t.normal_(p.mean, p.std, generator);
      return;
    }
    case v1::InitScheme::SCHEME_NOT_SET:
      break;
  }
  TORCH_CHECK(false, "init scheme not set");
}

bool IsFloat8(spec::DType dtype) {
  return dtype == spec::DType::kFloat8E4M3FN ||
         dtype == spec::DType::kFloat8E5M2;
}

}  // namespace

absl::Status ApplyInits(const std::vector<spec::TensorDesc>& tensors,
                        const std::vector<ResolvedInit>& inits, uint64_t seed,
                        v1::RngMode rng, memory::Arena& arena) {
  if (inits.size() != tensors.size() ||
      arena.num_tensors() != tensors.size()) {
    return absl::InternalError("init: tensor, init and arena counts differ");
  }
  if (rng == v1::RNG_MODE_UNSPECIFIED) rng = kDefaultRngMode;
  if (rng != v1::RNG_MODE_TORCH) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rng: unknown mode ", static_cast<int>(rng)));
  }
  std::vector<at::Tensor>& views = arena.tensors().views;

  return GuardTorch("initializing tensors", [&] {
    // One tensor per task: each has its own generator, so the result does
    // not depend on which thread runs it or in which order. Kernels called
    // inside a parallel region run single-threaded.
    at::parallel_for(0, static_cast<int64_t>(tensors.size()), 1,
                     [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const spec::TensorDesc& desc = tensors[i];
        const v1::InitScheme& scheme = inits[i].scheme;
        at::Tensor& view = views[i];
        if (desc.numel == 0) continue;
        std::optional<at::Generator> generator;
        if (IsRandom(scheme)) {
          generator = MakeGenerator(view.device(), DeriveSeed(seed, desc.name));
        }
        if (IsFloat8(desc.dtype)) {
          // float8 kernels are sparse in LibTorch: fill in float32, then
          // round to float8 (Python: torch.empty(shape).<init>.to(dtype)).
          at::Tensor wide = at::empty(view.sizes(),
                                      view.options().dtype(at::kFloat));
          Fill(wide, scheme, generator);
          view.copy_(wide);
        } else {
          Fill(view, scheme, generator);
        }
      }
    });
  });
}

}  // namespace materializer::init
