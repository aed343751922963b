#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_H_

// Portable elementwise programs (InitStep.map in RNG_MODE_PORTABLE): value
// 0 is the step's leaf (its draw or known values), op k makes value k + 1
// from earlier values and constants, every op in the program's compute
// dtype (float64 for map.dtype float64, else float32) with the exact
// arithmetic of elementwise_math.h. docs/portable-rng.md, section 14,
// defines each op; the result is the last value.
//
//   std::vector<float> values = ...;  // the leaf
//   RunElementwise(ops, values.data(), values.data(), n, threads);
//
// Thread-safe: pure functions over caller-owned buffers. The ops must have
// passed validation (server/init/elementwise.h): operands refer to earlier
// values, and the value bounds exclude NaN and the functions' poles.

#include <cstdint>
#include <vector>

namespace materializer::init::portable {

enum class ElementwiseKind : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kNeg,
  kExp,
  kLog,
  kExpm1,
  kLog1p,
  kSqrt,
  kReciprocal,
  kClamp,
  kSoftplus,
};

struct ElementwiseOpDesc {
  ElementwiseKind kind = ElementwiseKind::kNeg;
  // The operand's value index.
  uint32_t x = 0;
  // Binary ops: the other value's index, or -1 for the constant `c`.
  int64_t y = -1;
  double c = 0.0;
  // c - x, c / x.
  bool constant_first = false;
  // Clamp bounds.
  bool has_min = false;
  bool has_max = false;
  double min = 0.0;
  double max = 0.0;
};

// Evaluates the program on `n` leaf values (`leaf`, read only) into `out`
// (may be `leaf`): out[i] = the last value at element i, computed in the
// leaf's dtype (constants rounded to it). Splits the work over up to
// `threads` threads.
void RunElementwise(const std::vector<ElementwiseOpDesc>& ops,
                    const double* leaf, double* out, int64_t n, int threads);
void RunElementwise(const std::vector<ElementwiseOpDesc>& ops,
                    const float* leaf, float* out, int64_t n, int threads);

// One op on one element, given the operand values (for tests).
double ApplyElementwiseOp(const ElementwiseOpDesc& op, double x, double y);
float ApplyElementwiseOp(const ElementwiseOpDesc& op, float x, float y);

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_ELEMENTWISE_H_
