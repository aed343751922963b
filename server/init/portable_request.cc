#include "server/init/portable_request.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "server/init/init_math.h"
#include "server/init/schemes.h"

namespace materializer::init {
namespace {

using portable::Distribution;

template <typename Kaiming>
absl::StatusOr<Distribution> KaimingDistribution(
    const Kaiming& k, bool uniform, const std::vector<int64_t>& shape) {
  absl::StatusOr<Fans> fans = FanInAndFanOut(shape);
  if (!fans.ok()) return fans.status();
  absl::StatusOr<FanMode> mode = ParseFanMode(k.mode());
  if (!mode.ok()) return mode.status();
  const std::string nonlinearity =
      k.nonlinearity().empty() ? "leaky_relu" : k.nonlinearity();
  absl::StatusOr<double> gain =
      CalculateGain(nonlinearity, k.has_a() ? k.a() : 0.0);
  if (!gain.ok()) return gain.status();
  const double std = KaimingStd(
      *mode == FanMode::kFanIn ? fans->fan_in : fans->fan_out, *gain);
  if (!uniform) return Distribution::Normal(0.0, std);
  const double bound = UniformBoundForStd(std);
  return Distribution::Uniform(-bound, bound);
}

// The distribution a random scheme draws from, with its parameters computed
// as torch.nn.init computes them from `shape`.
absl::StatusOr<Distribution> DistributionOf(const v1::InitScheme& scheme,
                                            const std::vector<int64_t>& shape) {
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
      const TruncNormalParams p = GetParams(scheme.trunc_normal());
      return Distribution::TruncNormal(p.mean, p.std, p.a, p.b);
    }
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal: {
      const bool uniform = scheme.has_xavier_uniform();
      absl::StatusOr<double> gain =
          ResolveGain(uniform ? scheme.xavier_uniform().gain()
                              : scheme.xavier_normal().gain(),
                      "gain");
      if (!gain.ok()) return gain.status();
      absl::StatusOr<Fans> fans = FanInAndFanOut(shape);
      if (!fans.ok()) return fans.status();
      const double std = XavierStd(*fans, *gain);
      if (!uniform) return Distribution::Normal(0.0, std);
      const double bound = UniformBoundForStd(std);
      return Distribution::Uniform(-bound, bound);
    }
    case v1::InitScheme::kKaimingUniform:
      return KaimingDistribution(scheme.kaiming_uniform(), true, shape);
    case v1::InitScheme::kKaimingNormal:
      return KaimingDistribution(scheme.kaiming_normal(), false, shape);
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(DescribeScheme(scheme), " is not a portable random scheme"));
}

}  // namespace

absl::StatusOr<portable::PortableRequest> PortableRequestFor(
    const v1::InitScheme& scheme, const PortableTarget& target, uint64_t seed) {
  portable::PortableRequest request;
  request.seed = seed;
  request.name_hash = portable::NameHash(target.name);
  request.stream = target.stream;
  request.dtype = target.dtype;
  absl::StatusOr<Distribution> dist = DistributionOf(scheme, target.shape);
  if (!dist.ok()) return dist.status();
  request.dist = *dist;
  request.shape = target.shape;
  request.box = target.box;
  return request;
}

absl::Status CheckPortableRequest(const portable::PortableRequest& request) {
  if (absl::Status s = portable::ValidatePortableRequest(request); !s.ok()) {
    return s;
  }
  const portable::Box box =
      request.box.has_value() ? *request.box : portable::FullBox(request.shape);
  return portable::MakeRunLayout(request.shape, box).status();
}

}  // namespace materializer::init
