#ifndef MATERIALIZER_SERVER_SPEC_TORCH_DTYPE_H_
#define MATERIALIZER_SERVER_SPEC_TORCH_DTYPE_H_

// DType <-> LibTorch. Only files that talk to LibTorch include this.

#include "c10/core/ScalarType.h"
#include "server/spec/dtype.h"

namespace materializer::spec {

inline c10::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return c10::ScalarType::Float;
    case DType::kFloat64:
      return c10::ScalarType::Double;
    case DType::kFloat16:
      return c10::ScalarType::Half;
    case DType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case DType::kInt8:
      return c10::ScalarType::Char;
    case DType::kInt16:
      return c10::ScalarType::Short;
    case DType::kInt32:
      return c10::ScalarType::Int;
    case DType::kInt64:
      return c10::ScalarType::Long;
    case DType::kUInt8:
      return c10::ScalarType::Byte;
    case DType::kBool:
      return c10::ScalarType::Bool;
    case DType::kFloat8E4M3FN:
      return c10::ScalarType::Float8_e4m3fn;
    case DType::kFloat8E5M2:
      return c10::ScalarType::Float8_e5m2;
    case DType::kComplex64:
      return c10::ScalarType::ComplexFloat;
  }
  return c10::ScalarType::Undefined;
}

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_TORCH_DTYPE_H_
