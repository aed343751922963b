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

// y is the other value, or the constant when op.y < 0.
inline double ElementwiseOpValue(const ElementwiseOpDesc& op, double x,
                                 double y) {
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
      return PowF64(x, op.c);
    case ElementwiseKind::kNeg:
      return -x;
    case ElementwiseKind::kExp:
      return ExpF64(x);
    case ElementwiseKind::kLog:
      return LogAnyF64(x);
    case ElementwiseKind::kExpm1:
      return Expm1F64(x);
    case ElementwiseKind::kLog1p:
      return Log1pF64(x);
    case ElementwiseKind::kSqrt:
      return Sqrt(x);
    case ElementwiseKind::kReciprocal:
      return Div(1.0, x);
    case ElementwiseKind::kClamp: {
      double v = x;
      if (op.has_min) v = v < op.min ? op.min : v;
      if (op.has_max) v = v > op.max ? op.max : v;
      return v;
    }
    case ElementwiseKind::kSoftplus:
      return SoftplusF64(x);
  }
  return x;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_OP_H_
