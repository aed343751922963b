#include "server/init/apply.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <numeric>
#include <thread>

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

// Our init threads already run tensors in parallel; a LibTorch kernel that
// opens an OpenMP team of its own inside each would oversubscribe the
// machine (threads x cores). OpenMP's thread count is a per-thread setting,
// so each init thread sets its own to 1. LibTorch loads the OpenMP runtime;
// it is looked up rather than linked, and a LibTorch without OpenMP needs
// nothing.
void UseOneOpenMpThreadHere() {
  using SetNumThreads = void (*)(int);
  static const SetNumThreads set_num_threads = reinterpret_cast<SetNumThreads>(
      dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set_num_threads != nullptr) set_num_threads(1);
}

// Runs fill(i) for every tensor on up to `threads` threads, largest tensors
// first (longest-processing-time order keeps the threads evenly loaded when
// one tensor, such as an embedding, dominates). Rethrows the first
// exception after every thread has stopped.
template <typename Fill>
void ForEachTensorInParallel(const std::vector<spec::TensorDesc>& tensors,
                             int threads, Fill fill) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].nbytes > tensors[b].nbytes;
  });
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::atomic_flag error_set = ATOMIC_FLAG_INIT;
  auto work = [&] {
    UseOneOpenMpThreadHere();
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t k = next.fetch_add(1);
      if (k >= order.size()) return;
      try {
        fill(order[k]);
      } catch (...) {
        if (!error_set.test_and_set()) error = std::current_exception();
        failed.store(true);
      }
    }
  };
  threads = std::max(1, std::min<int>(threads, static_cast<int>(order.size())));
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
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

  // One task per tensor: each has its own generator, so the result does not
  // depend on which thread runs it or in which order.
  return GuardTorch("initializing tensors", [&] {
    ForEachTensorInParallel(tensors, at::get_num_threads(), [&](size_t i) {
      const spec::TensorDesc& desc = tensors[i];
      const v1::InitScheme& scheme = inits[i].scheme;
      at::Tensor& view = views[i];
      if (desc.numel == 0) return;
      std::optional<at::Generator> generator;
      if (IsRandom(scheme)) {
        generator = MakeGenerator(view.device(), DeriveSeed(seed, desc.name));
      }
      if (IsFloat8(desc.dtype)) {
        // float8 kernels are sparse in LibTorch: fill in float32, then
        // round to float8 (Python: torch.empty(shape).<init>.to(dtype)).
        at::Tensor wide =
            at::empty(view.sizes(), view.options().dtype(at::kFloat));
        Fill(wide, scheme, generator);
        view.copy_(wide);
      } else {
        Fill(view, scheme, generator);
      }
    });
  });
}

}  // namespace materializer::init
