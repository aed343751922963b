#ifndef MATERIALIZER_SERVER_SPEC_DTYPE_H_
#define MATERIALIZER_SERVER_SPEC_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace materializer::spec {

// Element types a tensor may have. The wire form is torch's dtype name.
enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kFloat8E4M3FN,
  kFloat8E5M2,
  // Pairs of float32 (real, imaginary). Only deterministic inits (zeros,
  // ones, constant, empty, values) and checkpoint bytes: torch's random
  // draws on complex tensors have no portable definition here.
  kComplex64,
};

struct DTypeInfo {
  DType dtype;
  // torch name without "torch.", e.g. "bfloat16".
  const char* name;
  uint32_t itemsize;
  // safetensors header dtype, e.g. "BF16".
  const char* safetensors_name;
  bool is_floating_point;
  // complex64: two float32 per element.
  bool is_complex = false;
};

const DTypeInfo& Info(DType dtype);
inline const char* Name(DType dtype) { return Info(dtype).name; }
inline uint32_t ItemSize(DType dtype) { return Info(dtype).itemsize; }
inline bool IsComplex(DType dtype) { return Info(dtype).is_complex; }

// The last DType, for loops over all of them.
inline constexpr DType kLastDType = DType::kComplex64;

// Accepts the canonical names above, torch's aliases ("float", "half",
// "double", "long", "int", "short", "cfloat"...), and a "torch." prefix.
std::optional<DType> ParseDType(absl::string_view text);

// "float32, float64, ..." for error messages.
std::string KnownDTypeNames();

}  // namespace materializer::spec

#endif  // MATERIALIZER_SERVER_SPEC_DTYPE_H_
