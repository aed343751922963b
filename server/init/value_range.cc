#include "server/init/value_range.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/init_math.h"
#include "server/init/schemes.h"

namespace materializer::init {
namespace {

using spec::DType;

// Python's math.pi.
constexpr double kPi = 3.141592653589793;

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

std::string ShapeText(const spec::TensorDesc& target) {
  return absl::StrCat("[", absl::StrJoin(target.full_shape(), ", "), "]");
}

// "float32's largest finite value 3.4028235e+38".
std::string LimitText(DType dtype) {
  return absl::StrCat(spec::Name(dtype), "'s largest finite value ",
                      ShortNumber(MaxFinite(dtype)));
}

// Range of an integer dtype.
void IntRange(DType dtype, double* lo, double* hi) {
  switch (dtype) {
    case DType::kInt8:
      *lo = -128;
      *hi = 127;
      return;
    case DType::kInt16:
      *lo = -32768;
      *hi = 32767;
      return;
    case DType::kInt32:
      *lo = -2147483648.0;
      *hi = 2147483647.0;
      return;
    case DType::kInt64:
      *lo = -9223372036854775808.0;
      *hi = 9223372036854775807.0;
      return;
    case DType::kUInt8:
      *lo = 0;
      *hi = 255;
      return;
    case DType::kBool:
      *lo = 0;
      *hi = 1;
      return;
    default:
      *lo = -std::numeric_limits<double>::max();
      *hi = std::numeric_limits<double>::max();
  }
}

// `value` itself is a value of the dtype: within the finite range of a
// floating dtype, an integer in range for the others. torch's fill_ and
// clamp_ refuse the rest ("value cannot be converted ... without
// overflow").
absl::Status Representable(absl::string_view field, double value, DType dtype) {
  const spec::DTypeInfo& info = spec::Info(dtype);
  if (info.is_floating_point || info.is_complex) {
    // complex64: the value is the real part, a float32.
    const DType part = info.is_complex ? DType::kFloat32 : dtype;
    if (std::fabs(value) > MaxFinite(part)) {
      return Invalid(absl::StrCat(
          field, " is ", ShortNumber(value), ", which overflows ", info.name,
          " (largest finite value ", ShortNumber(MaxFinite(part)), ")"));
    }
    return absl::OkStatus();
  }
  double lo = 0;
  double hi = 0;
  IntRange(dtype, &lo, &hi);
  if (value != std::floor(value) || value < lo || value > hi) {
    return Invalid(absl::StrCat(field, " is ", ShortNumber(value), ", which ",
                                info.name, " cannot represent (integers in [",
                                ShortNumber(lo), ", ", ShortNumber(hi), "])"));
  }
  // int64's upper bound is not an exact double; 2^63 itself is out.
  if (dtype == DType::kInt64 && value >= 9223372036854775808.0) {
    return Invalid(absl::StrCat(field, " is ", ShortNumber(value),
                                ", which overflows int64"));
  }
  return absl::OkStatus();
}

// `extent` (a derived magnitude, computed in double; inf when that
// overflowed) must not exceed the dtype's largest finite value.
absl::Status Within(double extent, DType dtype, absl::string_view what) {
  if (std::isfinite(extent) && extent <= MaxFinite(dtype)) {
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(what, " is ", ShortNumber(extent), ", beyond ",
                              LimitText(dtype)));
}

absl::Status CheckUniform(const v1::Uniform& uniform, DType dtype) {
  const UniformParams p = GetParams(uniform);
  if (absl::Status s = Representable("uniform.a", p.a, dtype); !s.ok()) {
    return s;
  }
  if (absl::Status s = Representable("uniform.b", p.b, dtype); !s.ok()) {
    return s;
  }
  // torch's uniform_ refuses to - from beyond the dtype's largest value
  // (its kernel scales by it).
  return Within(p.b - p.a, dtype, "uniform.b - uniform.a");
}

absl::Status CheckNormal(const v1::Normal& normal, DType dtype) {
  const NormalParams p = GetParams(normal);
  return Within(std::fabs(p.mean) + kNormalDrawBound * p.std, dtype,
                absl::StrCat("normal.mean and normal.std: |mean| + 9 std "
                             "(normal draws reach 9 standard deviations)"));
}

// Values are clamped to [a, b], so a and b bound them; torch's kernels
// also take mean and std * sqrt(2) as numbers of the dtype's arithmetic
// (a mean or scale that overflows gives inf - inf = NaN before the clamp).
absl::Status CheckTruncNormal(const v1::TruncNormal& trunc_normal,
                              DType dtype) {
  const TruncNormalParams p = GetParams(trunc_normal);
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"trunc_normal.a", p.a},
        {"trunc_normal.b", p.b},
        {"trunc_normal.mean", p.mean}}) {
    if (absl::Status s = Representable(field, value, dtype); !s.ok()) return s;
  }
  return Within(p.std * std::sqrt(2.0), dtype,
                "trunc_normal.std: std * sqrt(2) (the scale of its erfinv)");
}

// xavier_* and kaiming_*: a uniform over [-bound, bound] or a normal with a
// std derived from the fans and the gain.
absl::Status CheckFanScheme(const v1::InitScheme& scheme,
                            const spec::TensorDesc& target) {
  // No element, nothing drawn (and the fans of an empty shape can be
  // meaningless).
  if (target.full_numel() == 0) return absl::OkStatus();
  const std::string field =
      scheme.has_xavier_uniform()   ? "xavier_uniform.gain"
      : scheme.has_xavier_normal()  ? "xavier_normal.gain"
      : scheme.has_kaiming_uniform() ? "kaiming_uniform.a"
      : scheme.has_kaiming_normal() ? "kaiming_normal.a"
                                    : "";
  if (field.empty()) return absl::OkStatus();
  const FanSpread spread = FanSchemeSpread(scheme, target.full_shape()).value();
  // Uniform: torch's uniform_ needs the width 2 * bound within the dtype;
  // normal: the draws reach 9 std.
  const double extent = spread.uniform ? 2 * UniformBoundForStd(spread.std)
                                       : kNormalDrawBound * spread.std;
  return Within(
      extent, target.dtype,
      absl::StrCat(field, ": ", DescribeScheme(scheme), " on shape ",
                   ShapeText(target),
                   spread.uniform
                       ? " draws from [-bound, bound], whose width"
                       : " has a std of " + ShortNumber(spread.std) +
                             ", and 9 std"));
}

absl::Status CheckArange(const v1::Arange& arange,
                         const spec::TensorDesc& target) {
  const ArangeParams p = GetParams(arange);
  const DType dtype = target.dtype;
  const spec::DTypeInfo& info = spec::Info(dtype);
  const uint64_t numel = target.full_numel();
  if (numel == 0) return absl::OkStatus();
  if (info.is_floating_point) {
    // Computed in float64 (start + i * step), then rounded to the dtype.
    const double last = p.start + static_cast<double>(numel - 1) * p.step;
    for (double v : {p.start, last}) {
      if (!std::isfinite(v) || std::fabs(v) > MaxFinite(dtype)) {
        return Invalid(absl::StrCat(
            "arange.start and arange.step: arange(start=", ShortNumber(p.start),
            ", step=", ShortNumber(p.step), ") reaches ", ShortNumber(v),
            " over ", numel, " elements, which overflows ", info.name));
      }
    }
    return absl::OkStatus();
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"arange.start", p.start},
        {"arange.step", p.step}}) {
    if (value != std::floor(value) ||
        std::fabs(value) >= 9223372036854775808.0) {
      return Invalid(absl::StrCat(field, " is ", ShortNumber(value), "; ",
                                  info.name,
                                  " needs an integer that fits in int64"));
    }
  }
  // Exact: |start|, |step| < 2^63 and numel < 2^63, so this fits 127 bits.
  const __int128 start = static_cast<int64_t>(p.start);
  const __int128 last =
      start + static_cast<__int128>(numel - 1) *
                  static_cast<__int128>(static_cast<int64_t>(p.step));
  double lo = 0;
  double hi = 0;
  IntRange(dtype, &lo, &hi);
  const __int128 lo_i =
      dtype == DType::kInt64
          ? static_cast<__int128>(std::numeric_limits<int64_t>::min())
          : static_cast<__int128>(lo);
  const __int128 hi_i =
      dtype == DType::kInt64
          ? static_cast<__int128>(std::numeric_limits<int64_t>::max())
          : static_cast<__int128>(hi);
  for (__int128 v : {start, last}) {
    if (v < lo_i || v > hi_i) {
      return Invalid(absl::StrCat(
          "arange.start and arange.step: arange(start=", ShortNumber(p.start),
          ", step=", ShortNumber(p.step), ") over ", numel, " elements leaves ",
          info.name, "'s range [", ShortNumber(lo), ", ", ShortNumber(hi),
          "]"));
    }
  }
  return absl::OkStatus();
}

// inv_freq[i] = 1 / base^(2i / dim), then divided by the scaling factor or
// blended between that and the unscaled value (linear, llama3, yarn). For
// base >= 1 every frequency is at most 1; for base < 1 the largest is
// base^(-2 (n - 1) / dim). Half the dtype's range is kept as a margin for
// the float32 arithmetic in between (wavelengths, blends).
absl::Status CheckRope(const v1::RopeInvFreq& rope,
                       const spec::TensorDesc& target) {
  const int64_t length = target.full_shape()[0];
  if (length == 0) return absl::OkStatus();
  const RopeParams p = GetParams(rope, length);
  const double exponent =
      2.0 * static_cast<double>(length - 1) / static_cast<double>(p.dim);
  double largest = std::max(1.0, std::pow(p.base, -exponent));
  const bool scaled = p.type == RopeType::kLinear ||
                      p.type == RopeType::kLlama3 || p.type == RopeType::kYarn;
  if (scaled) largest *= std::max(1.0, 1.0 / p.factor);
  // Computed in float32 whatever the dtype (as Hugging Face does).
  const DType narrower = MaxFinite(target.dtype) < MaxFinite(DType::kFloat32)
                             ? target.dtype
                             : DType::kFloat32;
  if (!(largest <= MaxFinite(narrower) / 2)) {
    return Invalid(absl::StrCat(
        "rope_inv_freq.base", scaled ? " and rope_inv_freq.scaling.factor" : "",
        ": the largest inverse frequency is ", ShortNumber(largest),
        ", beyond half of ", LimitText(narrower),
        " (RoPE is computed in float32; half leaves a margin for the "
        "arithmetic in between)"));
  }
  if (p.type == RopeType::kYarn) {
    // find_correction_dim, as the fill computes it; its floor and ceil
    // become integers.
    for (const auto& [field, beta] :
         {std::pair<const char*, double>{"beta_fast", p.beta_fast},
          {"beta_slow", p.beta_slow}}) {
      const double max_position =
          static_cast<double>(p.original_max_position_embeddings);
      const double correction = (static_cast<double>(p.dim) *
                                 LibmLog(max_position / (beta * 2 * kPi))) /
                                (2 * LibmLog(p.base));
      if (!std::isfinite(correction) || std::fabs(correction) >= 0x1p62) {
        return Invalid(
            absl::StrCat("rope_inv_freq.scaling (yarn).", field, " is ",
                         ShortNumber(beta), " with base ", ShortNumber(p.base),
                         ": the correction dimension (find_correction_dim) is ",
                         ShortNumber(correction), ", not a usable integer"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FanSpread> FanSchemeSpread(const v1::InitScheme& scheme,
                                          const std::vector<int64_t>& shape) {
  absl::StatusOr<Fans> fans = FanInAndFanOut(shape);
  if (!fans.ok()) return fans.status();
  FanSpread out;
  if (scheme.has_xavier_uniform() || scheme.has_xavier_normal()) {
    out.uniform = scheme.has_xavier_uniform();
    absl::StatusOr<double> gain =
        ResolveGain(out.uniform ? scheme.xavier_uniform().gain()
                                : scheme.xavier_normal().gain(),
                    "gain");
    if (!gain.ok()) return gain.status();
    out.std = XavierStd(*fans, *gain);
    return out;
  }
  if (scheme.has_kaiming_uniform() || scheme.has_kaiming_normal()) {
    out.uniform = scheme.has_kaiming_uniform();
    const KaimingParams p =
        out.uniform ? GetKaimingParams(scheme.kaiming_uniform().a(),
                                       scheme.kaiming_uniform().mode(),
                                       scheme.kaiming_uniform().nonlinearity())
                    : GetKaimingParams(scheme.kaiming_normal().a(),
                                       scheme.kaiming_normal().mode(),
                                       scheme.kaiming_normal().nonlinearity());
    const int64_t fan = p.mode == FanMode::kFanIn ? fans->fan_in : fans->fan_out;
    absl::StatusOr<double> gain = CalculateGain(p.nonlinearity, p.a);
    if (!gain.ok()) return gain.status();
    out.std = KaimingStd(fan, *gain);
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(DescribeScheme(scheme), " is not a fan-based scheme"));
}

absl::Status CheckValueRange(const v1::InitScheme& scheme,
                             const spec::TensorDesc& target) {
  const DType dtype = target.dtype;
  switch (scheme.scheme_case()) {
    case v1::InitScheme::kConstant:
      return Representable("constant.val", scheme.constant().val(), dtype);
    case v1::InitScheme::kUniform:
      return CheckUniform(scheme.uniform(), dtype);
    case v1::InitScheme::kNormal:
      return CheckNormal(scheme.normal(), dtype);
    case v1::InitScheme::kTruncNormal:
      return CheckTruncNormal(scheme.trunc_normal(), dtype);
    case v1::InitScheme::kXavierUniform:
    case v1::InitScheme::kXavierNormal:
    case v1::InitScheme::kKaimingUniform:
    case v1::InitScheme::kKaimingNormal:
      return CheckFanScheme(scheme, target);
    case v1::InitScheme::kOrthogonal: {
      // The orthogonal matrix's entries are at most 1 in magnitude (up to
      // rounding; twice the gain leaves room for it).
      if (target.full_numel() == 0) return absl::OkStatus();
      const double gain =
          ResolveGain(scheme.orthogonal().gain(), "gain").value();
      return Within(2 * std::fabs(gain), dtype,
                    "orthogonal.gain: 2 |gain| (entries of an orthogonal "
                    "matrix are at most 1, times the gain)");
    }
    case v1::InitScheme::kSparse:
      return Within(kNormalDrawBound * GetParams(scheme.sparse()).std, dtype,
                    "sparse.std: 9 std (normal draws reach 9 standard "
                    "deviations)");
    case v1::InitScheme::kArange:
      return CheckArange(scheme.arange(), target);
    case v1::InitScheme::kRopeInvFreq:
      return CheckRope(scheme.rope_inv_freq(), target);
    default:
      // zeros, ones, eye, dirac write 0 and 1; empty writes nothing;
      // module_default is planned per module (module_plan.h).
      return absl::OkStatus();
  }
}

absl::Status CheckSchemeFits(const v1::InitScheme& scheme,
                             const spec::TensorDesc& target) {
  if (absl::Status s = CheckSchemeForTensor(scheme, target); !s.ok()) {
    return s;
  }
  return CheckValueRange(scheme, target);
}

}  // namespace materializer::init
