#ifndef MATERIALIZER_SERVER_INIT_INIT_MATH_H_
#define MATERIALIZER_SERVER_INIT_INIT_MATH_H_

// The scalar arithmetic of torch.nn.init, in double precision and with the
// same C library calls Python's `math` module makes (sqrt, pow, erf from the
// system libm), so every bound and standard deviation equals Python's to the
// last bit before it reaches a LibTorch kernel. No LibTorch here.
//
//   ASSIGN_OR_RETURN(Fans fans, FanInAndFanOut(tensor.shape));
//   ASSIGN_OR_RETURN(double gain, CalculateGain("leaky_relu", std::sqrt(5.0)));
//   const double bound = KaimingUniformBound(fans.fan_in, gain);
//
// Thread-safe: pure functions.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::init {

// torch.nn.init._calculate_fan_in_and_fan_out: dimension 1 (inputs) and
// dimension 0 (outputs), each times the product of dimensions 2.. (the
// receptive field). INVALID_ARGUMENT for fewer than 2 dimensions.
struct Fans {
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
absl::StatusOr<Fans> FanInAndFanOut(absl::Span<const int64_t> shape);

// Nonlinearity names calculate_gain accepts, for messages: "linear, conv1d,
// ..., selu".
std::string KnownNonlinearities();

// torch.nn.init.calculate_gain(nonlinearity, param). `param` is leaky_relu's
// negative slope (default 0.01) and ignored by the others, as in torch.
// INVALID_ARGUMENT for an unknown name (the message lists the valid ones).
absl::StatusOr<double> CalculateGain(absl::string_view nonlinearity,
                                     std::optional<double> param);

// The gain a Gain message stands for: its value, else calculate_gain of its
// nonlinearity, else 1. INVALID_ARGUMENT for an unknown nonlinearity or a
// non-finite value or param; the message starts with `field`.
absl::StatusOr<double> ResolveGain(const v1::Gain& gain,
                                   absl::string_view field);

// "fan_in" / "fan_out", case-insensitive as in torch (mode.lower()); empty
// means "fan_in". INVALID_ARGUMENT otherwise.
enum class FanMode { kFanIn, kFanOut };
absl::StatusOr<FanMode> ParseFanMode(absl::string_view mode);

// xavier_*: gain * sqrt(2 / (fan_in + fan_out)).
double XavierStd(const Fans& fans, double gain);
// kaiming_*: gain / sqrt(fan).
double KaimingStd(int64_t fan, double gain);
// The uniform bound for a standard deviation: sqrt(3) * std.
double UniformBoundForStd(double std);

// _no_grad_trunc_normal_'s uniform range [2l - 1, 2u - 1], where l and u are
// the normal CDF at (a - mean) / std and (b - mean) / std computed as
// (1 + erf(x / sqrt(2))) / 2.
struct TruncNormalRange {
  double low = 0;
  double high = 0;
};
TruncNormalRange TruncNormalUniformRange(double mean, double std, double a,
                                         double b);

// C library calls that the compiler must not replace by its own arithmetic
// (GCC turns pow(x, 2.0) into x * x, which differs from glibc's pow in the
// last bit for some x; Python's `x ** 2` calls pow).
double LibmPow(double x, double y);
double LibmErf(double x);
double LibmLog(double x);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_INIT_MATH_H_
