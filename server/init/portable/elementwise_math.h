#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_

// The functions of portable elementwise programs (InitStep.map), in float64
// (programs whose map.dtype is float64) and float32 (every other program):
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

// The functions are written without branches (selects instead), so that
// loops over them vectorize; the values are those of the definitions in
// docs/portable-rng.md, section 14, which branch.

// e^x. k = round(x / ln 2) by the 1.5 * 2^52 shift; r = x - k ln2 in two
// fma steps (log64's ln2 split); e^r by its Taylor polynomial to r^13 / 13!
// (|r| <= 0.347); then scaled by 2^k in two factors so that results below
// the smallest normal round once. x <= -746 gives 0, x >= 710 gives inf.
// k is read from t's bits (t = 1.5 * 2^52 + k exactly), and floor(k / 2)
// from k + 2048, which is never negative.
MAT_HD inline double ExpF64(double x) {
  const double shifter = 0x1.8p52;
  const double xc = x < -746.0 ? -746.0 : (x > 710.0 ? 710.0 : x);
  const double t = Fma(xc, 0x1.71547652b82fep+0, shifter);
  const double k = t - shifter;
  double r = Fma(-k, 0x1.62e42fee00000p-1, xc);
  r = Fma(-k, 0x1.a39ef35793c76p-33, r);
  const double p = Horner(
      r, 0x1.0000000000000p+0, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
      0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7,
      0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16,
      0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26,
      0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33);
  const uint64_t kb = AsU(t) - AsU(shifter);          // k, two's complement
  const uint64_t k1 = ((kb + 2048) >> 1) - 1024;       // floor(k / 2)
  const uint64_t k2 = kb - k1;
  const double scaled =
      (p * AsF((k1 + 1023) << 52)) * AsF((k2 + 1023) << 52);
  const double inf = AsF(uint64_t{0x7ff0000000000000});
  return x <= -746.0 ? 0.0 : (x >= 710.0 ? inf : scaled);
}

// e^x - 1 for |x| <= ln(2)/2: x * (1 + x/2 + x^2/6 + ... + x^13/14!).
MAT_HD inline double Expm1SmallF64(double x) {
  return x * Horner(x, 0x1.0000000000000p+0, 0x1.0000000000000p-1,
                    0x1.5555555555555p-3, 0x1.5555555555555p-5,
                    0x1.1111111111111p-7, 0x1.6c16c16c16c17p-10,
                    0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16,
                    0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22,
                    0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29,
                    0x1.6124613a86d09p-33, 0x1.93974a8c07c9dp-37);
}

// Whether Expm1F64 takes its polynomial at x.
MAT_HD inline bool Expm1IsSmall(double x) {
  const double half_ln2 = 0x1.62e42fefa39efp-2;
  return !(x > half_ln2 || x < -half_ln2);
}

// e^x - 1: Expm1SmallF64(x) for |x| <= ln(2)/2, else ExpF64(x) - 1.
MAT_HD inline double Expm1F64(double x) {
  const double small = Expm1SmallF64(x);
  const double large = ExpF64(x) - 1.0;
  return Expm1IsSmall(x) ? small : large;
}

// ln(x) for any positive finite x: log64 (section 6.4) for normal x; a
// subnormal x is scaled by 2^54 first and 54 ln 2 subtracted. The exponent
// becomes a double through the 2^52 shift (exact), where LogF64 converts an
// integer: the same value.
MAT_HD inline double LogAnyF64(double x) {
  const bool subnormal = x < 0x1p-1022;
  const double xs = subnormal ? x * 0x1p54 : x;
  const uint64_t bits = AsU(xs);
  const uint64_t biased_exponent = bits >> 52;
  const double m0 =
      AsF((bits & uint64_t{0x000fffffffffffff}) | uint64_t{0x3ff0000000000000});
  const bool big = m0 > 0x1.6a09e667f3bcdp+0;
  const double m = big ? m0 * 0.5 : m0;
  const uint64_t eb = biased_exponent + (big ? 1 : 0);  // e + 1023
  const double e =
      (AsF(uint64_t{0x4330000000000000} | eb) - 0x1p52) - 1023.0;
  const double f = m - 1.0;
  const double s = Div(f, f + 2.0);
  const double z = s * s;
  const double p =
      Horner(z, 0x1.5555555555558p-1, 0x1.99999999952abp-2,
             0x1.2492492df7663p-2, 0x1.c71c62ddb431bp-3, 0x1.7462b6e311a89p-3,
             0x1.39fe16ad885a7p-3, 0x1.2b5bd9a316a24p-3);
  const double ln_m = Fma(s * z, p, s + s);
  const double r =
      Fma(e, 0x1.62e42fee00000p-1, Fma(e, 0x1.a39ef35793c76p-33, ln_m));
  return subnormal ? r - 0x1.2b708872320e2p+5 : r;
}

// ln(1 + x) for x > -1: u = 1 + x; x itself when u == 1, else
// ln(u) * (x / (u - 1)), which cancels the rounding of u.
MAT_HD inline double Log1pF64(double x) {
  const double u = 1.0 + x;
  const double r = LogAnyF64(u) * Div(x, u - 1.0);
  return u == 1.0 ? x : r;
}

// torch.nn.functional.softplus with beta 1, threshold 20: x above 20,
// else log1p(exp(x)).
MAT_HD inline double SoftplusF64(double x) {
  const double r = Log1pF64(ExpF64(x));
  return x > 20.0 ? x : r;
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

// ---- float32 ---------------------------------------------------------------
// The same functions in float32 arithmetic, for programs that compute in
// float32 (the default): 8 lanes per AVX2 vector and polynomials of half the
// degree, the accuracy a float32 model's own code gets from its framework.

// e^x in float32: the float64 steps with k = round(x / ln 2) by the
// 1.5 * 2^23 shift, ln 2 split as in LogF32 (0x1.62ep-1 has 13 bits, so
// k * it is exact for |k| <= 150), and e^r by its Taylor polynomial to
// r^7 / 7!. x <= -104 gives 0 (e^-104 is below half the smallest
// subnormal), x >= 89 gives inf.
MAT_HD inline float ExpF32(float x) {
  const float shifter = 0x1.8p23f;
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float t = Fma(xc, 0x1.715476p+0f, shifter);
  const float k = t - shifter;
  float r = Fma(-k, 0x1.62ep-1f, xc);
  r = Fma(-k, 0x1.0bfbe8p-15f, r);
  const float p = Horner(r, 0x1.0p+0f, 0x1.0p+0f, 0x1.0p-1f, 0x1.555556p-3f,
                         0x1.555556p-5f, 0x1.111112p-7f, 0x1.6c16c2p-10f,
                         0x1.a01a02p-13f);
  const uint32_t kb = AsU(t) - AsU(shifter);     // k, two's complement
  const uint32_t k1 = ((kb + 256u) >> 1) - 128u;  // floor(k / 2)
  const uint32_t k2 = kb - k1;
  const float scaled = (p * AsF((k1 + 127u) << 23)) * AsF((k2 + 127u) << 23);
  const float inf = AsF(uint32_t{0x7f800000u});
  return x <= -104.0f ? 0.0f : (x >= 89.0f ? inf : scaled);
}

// e^x - 1 for |x| <= ln(2)/2: x * (1 + x/2 + ... + x^6/7!).
MAT_HD inline float Expm1SmallF32(float x) {
  return x * Horner(x, 0x1.0p+0f, 0x1.0p-1f, 0x1.555556p-3f, 0x1.555556p-5f,
                    0x1.111112p-7f, 0x1.6c16c2p-10f, 0x1.a01a02p-13f);
}

MAT_HD inline bool Expm1IsSmall(float x) {
  const float half_ln2 = 0x1.62e430p-2f;
  return !(x > half_ln2 || x < -half_ln2);
}

MAT_HD inline float Expm1F32(float x) {
  const float small = Expm1SmallF32(x);
  const float large = ExpF32(x) - 1.0f;
  return Expm1IsSmall(x) ? small : large;
}

// ln(x) for any positive finite x: LogF32 (the normal draw's log,
// exact_math.h) for normal x; a subnormal x is scaled by 2^23 first and
// 23 ln 2 (rounded to float32) subtracted.
MAT_HD inline float LogAnyF32(float x) {
  const bool subnormal = x < 0x1p-126f;
  const float r = LogF32(subnormal ? x * 0x1p23f : x);
  return subnormal ? r - 0x1.fe2804p+3f : r;
}

MAT_HD inline float Log1pF32(float x) {
  const float u = 1.0f + x;
  const float r = LogAnyF32(u) * Div(x, u - 1.0f);
  return u == 1.0f ? x : r;
}

MAT_HD inline float SoftplusF32(float x) {
  const float r = Log1pF32(ExpF32(x));
  return x > 20.0f ? x : r;
}

// x ** c, c already rounded to float32: PowF64's cases in float32.
MAT_HD inline float PowF32(float x, float c) {
  if (c == 0.0f) return 1.0f;
  if (c == 1.0f) return x;
  if (c == 2.0f) return x * x;
  if (c == 3.0f) return (x * x) * x;
  if (c == 0.5f) return Sqrt(x);
  if (c == -1.0f) return Div(1.0f, x);
  if (x == 0.0f) return 0.0f;
  if (x > 0.0f) return ExpF32(c * LogAnyF32(x));
  const float magnitude = ExpF32(c * LogAnyF32(-x));
  // c is an integer here; every float32 of magnitude 2^24 or more is even.
  const bool even = !(c < 0x1p24f && c > -0x1p24f) ||
                    (static_cast<int32_t>(c) & 1) == 0;
  return even ? magnitude : -magnitude;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_MATH_H_
