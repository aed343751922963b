#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_EXACT_MATH_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_EXACT_MATH_H_

// log, sin(pi x), cos(pi x) and erfinv written with the basic operations
// IEEE 754 rounds correctly everywhere (+, -, *, /, sqrt, fma in
// round-to-nearest-even) in a fixed order, so the host (any x86-64 path)
// and the device (nvcc) give the same bits. No libm, no fast-math.
//
// The code is generic over the float type F: plain float and double here,
// and the SIMD vectors of the CPU kernels, which supply the same small set
// of operations (Fma, Sqrt, Div, AsU/AsF, ToFloat, Lt/Gt/Eq, Select) as
// overloads. The polynomials come from fit_coefficients.py (Chebyshev
// interpolation, rounded coefficients) and docs/portable-rng.md states each
// one with its evaluation order. These constants define the portable rng:
// changing any of them changes the bits of every tensor.
//
// Build requirements, which this header cannot enforce by itself:
//   - host: -ffp-contract=off (no a*b+c fused behind our back); no
//     -ffast-math; SSE arithmetic (any x86-64).
//   - nvcc: --fmad=false (emits mul.rn/add.rn, which ptxas never fuses);
//     no --use_fast_math. Div and Sqrt use the _rn intrinsics on the device.
//   - subnormals are not flushed (no FTZ/DAZ): the default on both.
// portable_kernel_compile_test checks the PTX for unfused operations.

#include <cstdint>
#include <cstring>

#include "server/init/portable/hd.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// ---- The operations, for scalar float and double --------------------------

template <class F>
struct FloatTraits;
template <>
struct FloatTraits<float> {
  using U = uint32_t;  // same width, for bit manipulation
  using M = bool;      // comparison result
};
template <>
struct FloatTraits<double> {
  using U = uint64_t;
  using M = bool;
};

MAT_HD inline float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}
MAT_HD inline double Fma(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return __builtin_fma(a, b, c);
#endif
}
MAT_HD inline float Sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}
MAT_HD inline double Sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}
MAT_HD inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MAT_HD inline double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
MAT_HD inline uint32_t AsU(float a) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(a);
#else
  uint32_t u;
  memcpy(&u, &a, sizeof(u));
  return u;
#endif
}
MAT_HD inline uint64_t AsU(double a) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(a));
#else
  uint64_t u;
  memcpy(&u, &a, sizeof(u));
  return u;
#endif
}
MAT_HD inline float AsF(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float a;
  memcpy(&a, &u, sizeof(a));
  return a;
#endif
}
MAT_HD inline double AsF(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double a;
  memcpy(&a, &u, sizeof(a));
  return a;
#endif
}
// The word as a two's-complement integer, converted; exact for |value|
// < 2^24 (float) or 2^53 (double), which is all the callers pass.
MAT_HD inline float ToFloat(uint32_t u) {
  return static_cast<float>(static_cast<int32_t>(u));
}
MAT_HD inline double ToFloat(uint64_t u) {
  return static_cast<double>(static_cast<int64_t>(u));
}
template <class T>
MAT_HD inline bool Lt(T a, T b) {
  return a < b;
}
template <class T>
MAT_HD inline bool Gt(T a, T b) {
  return a > b;
}
template <class T>
MAT_HD inline bool Eq(T a, T b) {
  return a == b;
}
template <class T>
MAT_HD inline T Select(bool m, T a, T b) {
  return m ? a : b;
}

// a > b ? a : b, and a < b ? a : b: the second operand when they compare
// equal (so Max(-0, +0) is +0 and Max(+0, -0) is -0), as x86 MAXPS/MINPS.
template <class F>
MAT_HD inline F Max(F a, F b) {
  return Select(Gt(a, b), a, b);
}
template <class F>
MAT_HD inline F Min(F a, F b) {
  return Select(Lt(a, b), a, b);
}

// Exact negation (flips the sign bit, so -(+0) is -0). SIMD backends
// supply their own.
MAT_HD inline float Neg(float a) { return -a; }
MAT_HD inline double Neg(double a) { return -a; }

// c0 + z (c1 + z (c2 + ...)), innermost first:
// p = cn; p = fma(p, z, c(n-1)); ...; p = fma(p, z, c0).
template <class F, class C>
MAT_HD inline F Horner(F z, C c0) {
  return F(c0);
}
template <class F, class C, class... Cs>
MAT_HD inline F Horner(F z, C c0, Cs... rest) {
  return Fma(Horner(z, rest...), z, F(c0));
}

// ---- float32 ---------------------------------------------------------------

// ln(x) for positive normal x (callers never pass 0, subnormals, inf or
// NaN). x = 2^e m with m in [sqrt(1/2), sqrt(2)); s = (m - 1) / (m + 1);
// ln(m) = 2s + s^3 P(s^2); ln(x) = e ln2_hi + (e ln2_lo + ln(m)).
template <class F>
MAT_HD inline F LogF32(F x) {
  using U = typename FloatTraits<F>::U;
  const U bits = AsU(x);
  const U biased_exponent = bits >> 23;
  F m = AsF((bits & U(0x007fffffu)) | U(0x3f800000u));  // [1, 2)
  const auto big = Gt(m, F(0x1.6a09e6p+0f));            // float(sqrt(2))
  m = Select(big, m * F(0.5f), m);
  const F e = ToFloat(biased_exponent - Select(big, U(126u), U(127u)));
  const F f = m - F(1.0f);  // exact (Sterbenz)
  const F s = Div(f, f + F(2.0f));
  const F z = s * s;
  const F p = Horner(z, 0x1.55555cp-1f, 0x1.997c28p-2f, 0x1.2ee76cp-2f);
  const F ln_m = Fma(s * z, p, s + s);
  return Fma(e, F(0x1.62ep-1f), Fma(e, F(0x1.0bfbe8p-15f), ln_m));
}

// sin(pi x) and cos(pi x) for |x| <= 1/4.
template <class F>
MAT_HD inline void SinCosPiF32(F x, F* sin_pi_x, F* cos_pi_x) {
  const F z = x * x;
  *sin_pi_x = x * Horner(z, 0x1.921fb6p+1f, -0x1.4abbbap+2f, 0x1.465ec4p+1f,
                         -0x1.2d9b40p-1f);
  *cos_pi_x = Horner(z, 0x1.0p+0f, -0x1.3bd3ccp+2f, 0x1.03c1dcp+2f,
                     -0x1.55c57ap+0f, 0x1.d9c2e8p-3f);
}

// erfinv(x) for x in [-1, 1]: x p(w), w = -ln((1 - x)(1 + x)), with one
// polynomial in w - 2.5 for w < 5 and one in sqrt(w) - 3 above. The
// argument of the logarithm is clamped to >= 2^-24 (the smallest value
// |x| < 1 can produce is about 2^-23), so x = +-1, which only rounding can
// produce, maps to the largest finite quantile (~ +-3.9) instead of
// infinity.
template <class F>
MAT_HD inline F ErfInvF32(F x) {
  const F t = Max((F(1.0f) - x) * (F(1.0f) + x), F(0x1p-24f));
  const F w = Neg(LogF32(t));
  const F central = Horner(w - F(2.5f), 0x1.805c5ep+0f, 0x1.f91e8ap-3f,
                           -0x1.11c506p-8f, -0x1.48650cp-10f, 0x1.c9e970p-13f,
                           -0x1.4db186p-18f, -0x1.d0eda0p-19f, 0x1.f6a6f8p-22f,
                           0x1.90e8acp-26f, -0x1.32e60ep-27f);
  const F tail =
      Horner(Sqrt(w) - F(3.0f), 0x1.6a9efcp+1f, 0x1.006dc4p+0f, 0x1.357ffep-7f,
             -0x1.f47f0ap-8f, 0x1.74bdc6p-8f, -0x1.d7ab7ap-9f, 0x1.850108p-10f,
             -0x1.ced4fcp-15f, -0x1.43eae8p-12f, 0x1.e21b7ep-14f);
  return Select(Lt(w, F(5.0f)), central, tail) * x;
}

// ---- float64 (scalar only) -------------------------------------------------

MAT_HD inline double LogF64(double x) {
  const uint64_t bits = AsU(x);
  const uint64_t biased_exponent = bits >> 52;
  double m =
      AsF((bits & uint64_t{0x000fffffffffffff}) | uint64_t{0x3ff0000000000000});
  const bool big = m > 0x1.6a09e667f3bcdp+0;  // double(sqrt(2))
  if (big) m = m * 0.5;
  const double e = ToFloat(biased_exponent - (big ? 1022u : 1023u));
  const double f = m - 1.0;
  const double s = Div(f, f + 2.0);
  const double z = s * s;
  const double p =
      Horner(z, 0x1.5555555555558p-1, 0x1.99999999952abp-2,
             0x1.2492492df7663p-2, 0x1.c71c62ddb431bp-3, 0x1.7462b6e311a89p-3,
             0x1.39fe16ad885a7p-3, 0x1.2b5bd9a316a24p-3);
  const double ln_m = Fma(s * z, p, s + s);
  return Fma(e, 0x1.62e42fee00000p-1, Fma(e, 0x1.a39ef35793c76p-33, ln_m));
}

MAT_HD inline void SinCosPiF64(double x, double* sin_pi_x, double* cos_pi_x) {
  const double z = x * x;
  *sin_pi_x = x * Horner(z, 0x1.921fb54442d18p+1, -0x1.4abbce625be41p+2,
                         0x1.466bc677587f8p+1, -0x1.32d2cce2e5b19p-1,
                         0x1.50782fda12d96p-4, -0x1.e30071afc3e59p-8,
                         0x1.e3f38399551bfp-12);
  *cos_pi_x =
      Horner(z, 0x1.0p+0, -0x1.3bd3cc9be45dep+2, 0x1.03c1f081b5aacp+2,
             -0x1.55d3c7e3c90f8p+0, 0x1.e1f5068355e15p-3, -0x1.a6d1ec7906c20p-6,
             0x1.f9cc41140bb60p-10, -0x1.b264ba152378ap-14);
}

// As ErfInvF32, with three polynomials: in w - 3.125 for w < 6.25, in
// sqrt(w) - 3.25 for w < 16, in sqrt(w) - 5 above; clamp at 2^-53.
MAT_HD inline double ErfInvF64(double x) {
  const double t = Max((1.0 - x) * (1.0 + x), 0x1p-53);
  const double w = -LogF64(t);
  double p;
  if (w < 6.25) {
    p = Horner(
        w - 3.125, 0x1.a755e7c99ae86p+0, 0x1.ebd80d9b13df9p-3,
        -0x1.8b6c33114eeaep-8, -0x1.84576948353e1p-11, 0x1.879c2a20da432p-13,
        -0x1.d1d1f7ca4030fp-17, -0x1.6e8a53f106129p-20, 0x1.c6b4f890935ddp-22,
        -0x1.f36ce4ae847fdp-26, -0x1.1a9eb1bc8f0f0p-28, 0x1.20f4e6bf074cfp-30,
        -0x1.dc3ee8b6c53ccp-35, -0x1.c89564c5d1004p-37, 0x1.723527b7cff86p-39,
        -0x1.6d9ec5e3ec6afp-44, -0x1.686642b67610ap-45, 0x1.db523eb040288p-48,
        -0x1.73898c37dc54ap-55, -0x1.2c266176e7096p-53, 0x1.1f4ba5de5dc3fp-56,
        0x1.536d397f9b9b1p-60, -0x1.9d290dd3bcb70p-62, -0x1.5087a244b0f6cp-70,
        0x1.e9b8ae7230c25p-69);
  } else if (w < 16.0) {
    p = Horner(
        Sqrt(w) - 3.25, 0x1.8abcc380d5a48p+1, 0x1.0158a6d641d55p+0,
        0x1.5ffcfe5b6cd38p-8, -0x1.ebadabba02be5p-9, 0x1.468eeca944c44p-9,
        -0x1.ba9240d8768c3p-10, 0x1.f3cc545d9ca81p-11, -0x1.7448bcc8e9aa7p-12,
        0x1.932e8fd4360edp-16, 0x1.1e6abbe66ca02p-14, -0x1.8cf463501e9a0p-15,
        0x1.a241c6f237f34p-17, 0x1.899aa0e374402p-19, -0x1.0b79e820e8497p-18,
        0x1.8db69feb41fb6p-20, -0x1.da75906425fdap-26, -0x1.079a074d69940p-22,
        0x1.1a9484c4d3628p-23, -0x1.674f1725daa65p-26, -0x1.06f1da245bfd3p-26,
        0x1.07e3c2020286fp-27);
  } else {
    p = Horner(
        Sqrt(w) - 5.0, 0x1.3664ddd1ad7fbp+2, 0x1.02a30d1fba10ep+0,
        -0x1.22ea5df1a91f3p-13, -0x1.c2f36aa279aebp-13, 0x1.3ebf4ef3b5615p-14,
        -0x1.4a348fad7e348p-16, 0x1.2fbd02589bd26p-18, -0x1.0a907bf4485ffp-20,
        0x1.ebdffa9e50541p-23, -0x1.22257dfd46e27p-24, 0x1.f2d284f48daf0p-26,
        -0x1.061ede388d27fp-26, 0x1.0bc47e6a8d42bp-27, -0x1.dcbc784e3ddd5p-29,
        0x1.7179c8523efdcp-30, -0x1.e2ca102bd8fedp-32, 0x1.dfa104bdba6ccp-35,
        0x1.7c4c87ec06926p-35, -0x1.2be218c378d5ep-36);
  }
  return p * x;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_EXACT_MATH_H_
