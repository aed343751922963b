#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_OP_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_OP_H_

// One op of a portable elementwise program on one element (the
// definition; elementwise_block.cc runs it over blocks, vectorized where
// the ISA allows). Include only from translation units built with the
// portable flags (defs.bzl).

#include "server/init/portable/elementwise.h"
#include "server/init/portable/elementwise_math.h"
#include "server/init/portable/exact_math.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// The functions by compute dtype.
inline double ExpOf(double x) { return ExpF64(x); }
inline float ExpOf(float x) { return ExpF32(x); }
inline double Expm1SmallOf(double x) { return Expm1SmallF64(x); }
inline float Expm1SmallOf(float x) { return Expm1SmallF32(x); }
inline double Expm1Of(double x) { return Expm1F64(x); }
inline float Expm1Of(float x) { return Expm1F32(x); }
inline double LogOf(double x) { return LogAnyF64(x); }
inline float LogOf(float x) { return LogAnyF32(x); }
inline double Log1pOf(double x) { return Log1pF64(x); }
inline float Log1pOf(float x) { return Log1pF32(x); }
inline double SoftplusOf(double x) { return SoftplusF64(x); }
inline float SoftplusOf(float x) { return SoftplusF32(x); }
inline double PowOf(double x, double c) { return PowF64(x, c); }
inline float PowOf(float x, float c) { return PowF32(x, c); }

// One op in compute dtype T (float or double); y is the other value, or
// the constant (op.c rounded to T) when op.y < 0.
template <typename T>
inline T ElementwiseOpValue(const ElementwiseOpDesc& op, T x, T y) {
  switch (op.kind) {
    case ElementwiseKind::kAdd:
      return x + y;
    case ElementwiseKind::kSub:
      return op.constant_first && op.y < 0 ? y - x : x - y;
    case ElementwiseKind::kMul:
      return x * y;
    case ElementwiseKind::kDiv:
      return op.constant_first && op.y < 0 ? Div(y, x) : Div(x, y);
    case ElementwiseKind::kPow:
      return PowOf(x, static_cast<T>(op.c));
    case ElementwiseKind::kNeg:
      return -x;
    case ElementwiseKind::kExp:
      return ExpOf(x);
    case ElementwiseKind::kLog:
      return LogOf(x);
    case ElementwiseKind::kExpm1:
      return Expm1Of(x);
    case ElementwiseKind::kLog1p:
      return Log1pOf(x);
    case ElementwiseKind::kSqrt:
      return Sqrt(x);
    case ElementwiseKind::kReciprocal:
      return Div(T(1), x);
    case ElementwiseKind::kClamp: {
      T v = x;
      if (op.has_min) v = v < static_cast<T>(op.min) ? static_cast<T>(op.min) : v;
      if (op.has_max) v = v > static_cast<T>(op.max) ? static_cast<T>(op.max) : v;
      return v;
    }
    case ElementwiseKind::kSoftplus:
      return SoftplusOf(x);
  }
  return x;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_OP_H_
