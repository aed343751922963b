#include "server/init/portable_fill.h"

#include <dlfcn.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "server/init/fill.h"
#include "server/init/init_math.h"
#include "server/init/portable/portable.h"
#include "server/init/portable/portable_cuda.h"
#include "server/init/schemes.h"

namespace materializer::init {
namespace {

using portable::Distribution;

[[noreturn]] void Fail(const absl::Status& status) {
  throw std::runtime_error(std::string(status.message()));
}

template <typename T>
T OrFail(absl::StatusOr<T> value) {
  if (!value.ok()) Fail(value.status());
  return *std::move(value);
}

// The distribution a random scheme draws from, with its parameters computed
// as torch.nn.init computes them (from the full shape).
Distribution DistributionOf(const v1::InitScheme& scheme,
                            const std::vector<int64_t>& full_shape) {
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kUniform: {
      const UniformParams p = GetParams(scheme.uniform());
      return Distribution::Uniform(p.a, p.b);
    }
    case v1::InitScheme::kNormal: {
      const NormalParams p = GetParams(scheme.normal());
      return Distribution::Normal(p.mean, p.std);
    }
    case v1::InitScheme::kTruncNormal: {
      const v1::TruncNormal& t = scheme.trunc_normal();
      return Distribution::TruncNormal(t.has_mean() ? t.mean() : 0.0,
                                       t.has_std() ? t.std() : 1.0,
                                       t.has_a() ? t.a() : -2.0,
                                       t.has_b() ? t.b() : 2.0);
    }
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal: {
      const bool uniform = scheme.has_xavier_uniform();
      const v1::Gain& gain_spec = uniform ? scheme.xavier_uniform().gain()
                                          : scheme.xavier_normal().gain();
      const double gain = OrFail(ResolveGain(gain_spec, "gain"));
      const double std = XavierStd(OrFail(FanInAndFanOut(full_shape)), gain);
      if (!uniform) return Distribution::Normal(0.0, std);
      const double bound = UniformBoundForStd(std);
      return Distribution::Uniform(-bound, bound);
    }
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal: {
      const bool uniform = scheme.has_kaiming_uniform();
      const double a = uniform ? (scheme.kaiming_uniform().has_a()
                                      ? scheme.kaiming_uniform().a()
                                      : 0.0)
                               : (scheme.kaiming_normal().has_a()
                                      ? scheme.kaiming_normal().a()
                                      : 0.0);
      const std::string& mode_text = uniform ? scheme.kaiming_uniform().mode()
                                             : scheme.kaiming_normal().mode();
      std::string nonlinearity = uniform
                                     ? scheme.kaiming_uniform().nonlinearity()
                                     : scheme.kaiming_normal().nonlinearity();
      if (nonlinearity.empty()) nonlinearity = "leaky_relu";
      const Fans fans = OrFail(FanInAndFanOut(full_shape));
      const FanMode mode = OrFail(ParseFanMode(mode_text));
      const double gain = OrFail(CalculateGain(nonlinearity, a));
      const double std = KaimingStd(
          mode == FanMode::kFanIn ? fans.fan_in : fans.fan_out, gain);
      if (!uniform) return Distribution::Normal(0.0, std);
      const double bound = UniformBoundForStd(std);
      return Distribution::Uniform(-bound, bound);
    }
    default:
      break;
  }
  Fail(absl::InternalError(
      absl::StrCat(DescribeScheme(scheme), " is not a portable random scheme")));
}

bool NeedsFullTensor(const v1::InitScheme& scheme) {
  return scheme.has_eye() || scheme.has_dirac() || scheme.has_arange() ||
         scheme.has_rope_inv_freq();
}

// Waits for work queued on CUDA's legacy default stream.
void SynchronizeCuda() {
  using Synchronize = int (*)();
  static const Synchronize synchronize = [] {
    for (const char* name :
         {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (void* runtime = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) {
        return reinterpret_cast<Synchronize>(
            dlsym(runtime, "cudaDeviceSynchronize"));
      }
    }
    return static_cast<Synchronize>(nullptr);
  }();
  if (synchronize == nullptr || synchronize() != 0) {
    Fail(absl::InternalError("cudaDeviceSynchronize failed after a portable "
                             "fill"));
  }
}

}  // namespace

void FillPortableTensor(at::Tensor& view, const spec::TensorDesc& desc,
                        const v1::InitScheme& scheme, uint64_t seed,
                        int threads) {
  if (desc.numel == 0) return;
  if (!IsRandom(scheme)) {
    if (!desc.is_shard() || !NeedsFullTensor(scheme)) {
      Fill(view, scheme, std::nullopt);  // the value does not depend on where
      return;
    }
    // Computed for the full tensor, then sliced.
    at::Tensor full = at::empty(desc.full_shape(), view.options());
    Fill(full, scheme, std::nullopt);
    at::Tensor box = full;
    for (size_t d = 0; d < desc.shape.size(); ++d) {
      box = box.narrow(static_cast<int64_t>(d), desc.shard_offset[d],
                       desc.shape[d]);
    }
    view.copy_(box);
    return;
  }
  portable::PortableRequest request;
  request.seed = seed;
  request.name_hash = portable::NameHash(desc.name);
  request.dtype = desc.dtype;
  request.dist = DistributionOf(scheme, desc.full_shape());
  request.shape = desc.full_shape();
  if (desc.is_shard()) request.box = portable::Box{desc.shard_offset, desc.shape};
  if (view.is_cuda()) {
    absl::Status status =
        portable::FillPortableCuda(request, view.data_ptr(), nullptr);
    if (!status.ok()) Fail(status);
    SynchronizeCuda();
    return;
  }
  portable::FillOptions options;
  options.threads = threads;
  absl::Status status = portable::FillPortable(request, view.data_ptr(), options);
  if (!status.ok()) Fail(status);
}

}  // namespace materializer::init
