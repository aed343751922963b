#include "server/init/init_math.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/quote.h"

namespace materializer::init {
namespace {

// Called through volatile pointers so that no call is folded or rewritten
// at compile time: the values must be the library's, like Python's.
double (*volatile const kPow)(double, double) = &::pow;
double (*volatile const kErf)(double) = &::erf;
double (*volatile const kLog)(double) = &::log;

constexpr const char* kNonlinearities[] = {"linear",
                                           "conv1d",
                                           "conv2d",
                                           "conv3d",
                                           "conv_transpose1d",
                                           "conv_transpose2d",
                                           "conv_transpose3d",
                                           "sigmoid",
                                           "tanh",
                                           "relu",
                                           "leaky_relu",
                                           "selu"};

}  // namespace

double LibmPow(double x, double y) { return kPow(x, y); }
double LibmErf(double x) { return kErf(x); }
double LibmLog(double x) { return kLog(x); }

absl::StatusOr<Fans> FanInAndFanOut(absl::Span<const int64_t> shape) {
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fan in and fan out need a tensor with at least 2 dimensions; it has ",
        shape.size()));
  }
  // For a tensor with elements these products are at most its element
  // count; a zero-size shape's can overflow, and saturate (nothing reads
  // fans of a tensor without elements).
  auto times = [](int64_t a, int64_t b) {
    int64_t product = 0;
    return __builtin_mul_overflow(a, b, &product)
               ? std::numeric_limits<int64_t>::max()
               : product;
  };
  int64_t receptive_field = 1;
  for (size_t d = 2; d < shape.size(); ++d) {
    receptive_field = times(receptive_field, shape[d]);
  }
  return Fans{times(shape[1], receptive_field),
              times(shape[0], receptive_field)};
}

std::string KnownNonlinearities() {
  return absl::StrJoin(kNonlinearities, ", ");
}

absl::StatusOr<double> CalculateGain(absl::string_view nonlinearity,
                                     std::optional<double> param) {
  if (nonlinearity == "linear" || nonlinearity == "conv1d" ||
      nonlinearity == "conv2d" || nonlinearity == "conv3d" ||
      nonlinearity == "conv_transpose1d" ||
      nonlinearity == "conv_transpose2d" ||
      nonlinearity == "conv_transpose3d" || nonlinearity == "sigmoid") {
    return 1.0;
  }
  if (nonlinearity == "tanh") return 5.0 / 3;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") {
    const double negative_slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1 + LibmPow(negative_slope, 2)));
  }
  if (nonlinearity == "selu") return 3.0 / 4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown nonlinearity ", Quote(nonlinearity), "; use one of ",
                   KnownNonlinearities()));
}

absl::StatusOr<double> ResolveGain(const v1::Gain& gain,
                                   absl::string_view field) {
  if (gain.has_param() && !std::isfinite(gain.param())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".param is ", gain.param(), "; it must be finite"));
  }
  switch (gain.kind_case()) {
    case v1::Gain::kValue:
      if (!std::isfinite(gain.value())) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".value is ", gain.value(), "; it must be finite"));
      }
      if (gain.has_param()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field,
            ".param is set with a gain value; param belongs to the "
            "nonlinearity leaky_relu"));
      }
      return gain.value();
    case v1::Gain::kNonlinearity: {
      absl::StatusOr<double> value =
          CalculateGain(gain.nonlinearity(),
                        gain.has_param() ? std::optional<double>(gain.param())
                                         : std::nullopt);
      if (!value.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".nonlinearity: ", value.status().message()));
      }
      return value;
    }
    case v1::Gain::KIND_NOT_SET:
      break;
  }
  if (gain.has_param()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ".param is set without a nonlinearity; param is leaky_relu's "
        "negative slope"));
  }
  return 1.0;
}

absl::StatusOr<FanMode> ParseFanMode(absl::string_view mode) {
  const std::string lower = absl::AsciiStrToLower(mode);
  if (lower.empty() || lower == "fan_in") return FanMode::kFanIn;
  if (lower == "fan_out") return FanMode::kFanOut;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode ", Quote(mode), "; use one of fan_in, fan_out"));
}

double XavierStd(const Fans& fans, double gain) {
  // Python adds the fans as integers, then converts (rounding to nearest);
  // the sum of two int64 fans fits uint64.
  const uint64_t sum =
      static_cast<uint64_t>(fans.fan_in) + static_cast<uint64_t>(fans.fan_out);
  return gain * std::sqrt(2.0 / static_cast<double>(sum));
}

double KaimingStd(int64_t fan, double gain) {
  return gain / std::sqrt(static_cast<double>(fan));
}

double UniformBoundForStd(double std) { return std::sqrt(3.0) * std; }

TruncNormalRange TruncNormalUniformRange(double mean, double std, double a,
                                         double b) {
  auto norm_cdf = [](double x) {
    return (1.0 + LibmErf(x / std::sqrt(2.0))) / 2.0;
  };
  const double l = norm_cdf((a - mean) / std);
  const double u = norm_cdf((b - mean) / std);
  return {2 * l - 1, 2 * u - 1};
}

}  // namespace materializer::init
