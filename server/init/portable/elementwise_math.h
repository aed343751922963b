#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_

// The float64 functions of portable elementwise programs (InitStep.map):
// exp, expm1, log (any positive finite input), log1p, softplus and pow by a
// constant, written with the operations exact_math.h allows (+, -, *, /,
// sqrt, fma, correctly rounded; bit moves; comparisons) in a fixed order, so
// every target gives the same bits. docs/portable-rng.md, section 14
// ("Elementwise programs"), states each one; tests/python/portable_ref.py
// reimplements them.
//
// Callers keep the arguments in the domains the validation proves (no NaN
// in, and log's argument > 0): the functions below do not test for them.
//
// Build requirements: those of exact_math.h (no contraction, no fast-math).

#include <cstdint>

#include "server/init/portable/exact_math.h"
#include "server/init/portable/hd.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// 2^k for -1022 <= k <= 1023, from its bits.
MAT_HD inline double Pow2(int64_t k) {
  return AsF(static_cast<uint64_t>(k + 1023) << 52);
}

// e^x. k = round(x / ln 2) by the 1.5 * 2^52 shift; r = x - k ln2 in two
// fma steps (log64's ln2 split); e^r by its Taylor polynomial to r^13 / 13!
// (|r| <= 0.347); then scaled by 2^k in two factors so that results below
// the smallest normal round once. x <= -746 gives 0, x >= 710 gives inf.
MAT_HD inline double ExpF64(double x) {
  if (x <= -746.0) return 0.0;
  if (x >= 710.0) return AsF(uint64_t{0x7ff0000000000000});
  const double shifter = 0x1.8p52;
  const double t = Fma(x, 0x1.71547652b82fep+0, shifter);
  const double k = t - shifter;
  double r = Fma(-k, 0x1.62e42fee00000p-1, x);
  r = Fma(-k, 0x1.a39ef35793c76p-33, r);
  const double p = Horner(
      r, 0x1.0000000000000p+0, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
      0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7,
      0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16,
      0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26,
      0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33);
  const int64_t ki = static_cast<int64_t>(k);
  const int64_t k1 = ki >= 0 ? ki / 2 : -((-ki + 1) / 2);  // floor(k / 2)
  const int64_t k2 = ki - k1;
  return (p * Pow2(k1)) * Pow2(k2);
}

// e^x - 1: x * (1 + x/2 + x^2/6 + ... + x^13/14!) for |x| <= ln(2)/2,
// else ExpF64(x) - 1.
MAT_HD inline double Expm1F64(double x) {
  const double half_ln2 = 0x1.62e42fefa39efp-2;
  if (x > half_ln2 || x < -half_ln2) return ExpF64(x) - 1.0;
  return x * Horner(x, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
                    0x1.5555555555555p-3, 0x1.5555555555555p-5,
                    0x1.1111111111111p-7, 0x1.6c16c16c16c17p-10,
                    0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16,
                    0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22,
                    0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29,
                    0x1.6124613a86d09p-33, 0x1.93974a8c07c9dp-37);
}

// ln(x) for any positive finite x: LogF64 (exact_math.h) for normal x;
// a subnormal x is scaled by 2^54 first and 54 ln 2 subtracted.
MAT_HD inline double LogAnyF64(double x) {
  if (x < 0x1p-1022) return LogF64(x * 0x1p54) - 0x1.2b708872320e2p+5;
  return LogF64(x);
}

// ln(1 + x) for x > -1: u = 1 + x; x itself when u == 1, else
// ln(u) * (x / (u - 1)), which cancels the rounding of u.
MAT_HD inline double Log1pF64(double x) {
  const double u = 1.0 + x;
  if (u == 1.0) return x;
  return LogAnyF64(u) * Div(x, u - 1.0);
}

// torch.nn.functional.softplus with beta 1, threshold 20: x above 20,
// else log1p(exp(x)).
MAT_HD inline double SoftplusF64(double x) {
  return x > 20.0 ? x : Log1pF64(ExpF64(x));
}

// x ** c for a constant c: 1 for c == 0; x, x * x, x * x * x, sqrt(x),
// 1 / x for c = 1, 2, 3, 0.5, -1; else, for x > 0, exp(c ln x); for x == 0
// (c > 0), 0; for x < 0 (c an integer, which validation requires), the
// same on |x| with the sign of c's parity.
MAT_HD inline double PowF64(double x, double c) {
  if (c == 0.0) return 1.0;
  if (c == 1.0) return x;
  if (c == 2.0) return x * x;
  if (c == 3.0) return (x * x) * x;
  if (c == 0.5) return Sqrt(x);
  if (c == -1.0) return Div(1.0, x);
  if (x == 0.0) return 0.0;
  if (x > 0.0) return ExpF64(c * LogAnyF64(x));
  const double magnitude = ExpF64(c * LogAnyF64(-x));
  const double half = c * 0.5;
  // c is an integer here: odd when c / 2 is not.
  const double shifter = 0x1.8p52;
  const bool even = ((half + shifter) - shifter) == half;
  return even ? magnitude : -magnitude;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_
