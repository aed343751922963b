#ifndef MATERIALIZER_SERVER_INIT_VALUE_RANGE_H_
#define MATERIALIZER_SERVER_INIT_VALUE_RANGE_H_

// The finite ranges of the init schemes (docs/init.md, "Ranges"): for each
// scheme and dtype, the parameters that keep every value the scheme can
// write finite and representable in the dtype, derived values included
// (fans and gains, uniform bounds, trunc_normal's scale, arange's last
// value, RoPE's largest frequency). Validation checks them before anything
// is allocated, so a request that passes cannot fail while filling (torch's
// own checks, the portable kernels' parameter checks) and never gets inf or
// NaN. The rules are the same in both RNG modes and depend on the full
// tensor (or init-step region), never on a shard, so Plan, Materialize and
// every shard give the same answer.
//
//   RETURN_IF_ERROR(CheckSchemeFits(scheme, target));
//
// Thread-safe: pure functions. No LibTorch.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// The largest |z| a standard normal draw reaches in any generator the
// server uses: torch's CPU Box-Muller reaches sqrt(-2 ln 2^-53) = 8.57, its
// CUDA one (curand) 8.66, the portable one 8.57 (float64) or 5.77
// (float32). A normal-based scheme is valid when mean + 9 std fits.
inline constexpr double kNormalDrawBound = 9.0;

// The spread of a fan-based scheme (xavier_*, kaiming_*) filling `shape`:
// its std, and whether it draws uniformly (over [-sqrt(3) std, sqrt(3)
// std]) or normally, as torch.nn.init computes them. INVALID_ARGUMENT for
// any other scheme, or parameters whose gain or fans cannot be computed.
struct FanSpread {
  double std = 0.0;
  bool uniform = false;
};
absl::StatusOr<FanSpread> FanSchemeSpread(const v1::InitScheme& scheme,
                                          const std::vector<int64_t>& shape);

// Checks that every value `scheme` can write into `target` (its full
// shape and dtype: the whole tensor, or an init step's region) is finite
// and representable in the dtype. Expects CheckSchemeParameters and
// CheckSchemeForTensor to have passed. INVALID_ARGUMENT naming the
// parameters and the limit, e.g. "normal.std is 1e+308: |mean| + 9 std is
// 9e+308, beyond float32's largest finite value 3.4028235e+38 ...".
absl::Status CheckValueRange(const v1::InitScheme& scheme,
                             const spec::TensorDesc& target);

// CheckSchemeForTensor (schemes.h), then CheckValueRange: whether `scheme`
// can fill `target` with finite values of its dtype.
absl::Status CheckSchemeFits(const v1::InitScheme& scheme,
                             const spec::TensorDesc& target);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_VALUE_RANGE_H_
