#ifndef MATERIALIZER_SERVER_INIT_ELEMENTWISE_H_
#define MATERIALIZER_SERVER_INIT_ELEMENTWISE_H_

// Derived values (docs/init.md, "Derived values"): the elementwise program
// of an init step (InitStep.map) and the bounds validation proves for it.
//
// A program's value 0 is what the step's init makes (its "leaf": a draw, or
// known values); op k makes value k + 1. Validation runs interval
// arithmetic from the leaf's range (every value a scheme can write:
// uniform's [a, b], a normal's mean +- 9 std, a fill's constant, ...) through
// every op, and refuses a program whose values could leave the domain of
// an op (log of a value <= 0, a division by an interval holding 0, ...) or
// overflow the compute dtype or the tensor's dtype. The bounds are widened
// after every op by a few units in the last place of the compute dtype, so
// rounding never makes a refused case reachable. Correlations between
// operands are not tracked (x - x is bounded by [lo - hi, hi - lo]), so the
// check is conservative, never permissive.
//
//   ASSIGN_OR_RETURN(ParsedElementwise program, ParseElementwise(map, dtype));
//   ASSIGN_OR_RETURN(Interval leaf, LeafBounds(scheme, target));
//   RETURN_IF_ERROR(CheckElementwiseBounds(program, leaf, dtype).status());
//
// Thread-safe: pure functions. No LibTorch.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/init/portable/elementwise.h"
#include "server/spec/dtype.h"
#include "server/spec/tensor_desc.h"

namespace materializer::init {

// Ops in one program.
inline constexpr int kMaxElementwiseOps = 64;

// A closed interval of reals.
struct Interval {
  double lo = 0.0;
  double hi = 0.0;
};

struct ParsedElementwise {
  spec::DType compute = spec::DType::kFloat32;
  std::vector<portable::ElementwiseOpDesc> ops;
};

// Checks the program's form: a floating compute dtype (default: the
// tensor's, which must be floating), at most kMaxElementwiseOps ops, each a
// known kind whose operands are earlier values, binary ops with one other
// operand, POW with a constant exponent, finite constants, CLAMP with a
// bound and min <= max. INVALID_ARGUMENT with the reason naming the op
// (`map.ops[3]: ...`); the caller adds the step's path.
absl::StatusOr<ParsedElementwise> ParseElementwise(const v1::Elementwise& map,
                                                   spec::DType tensor_dtype);

// Every value `scheme` can write into `target` (its shape and dtype), for
// the schemes a program may start from: the random ones and the computed
// fills. values and empty are refused (send computed values as they are);
// norm_of is bounded by the caller, which knows its source.
absl::StatusOr<Interval> LeafBounds(const v1::InitScheme& scheme,
                                    const spec::TensorDesc& target);

// The bounds of the program's result, or INVALID_ARGUMENT naming the op
// that could produce inf or NaN (in the compute dtype) and why, or saying
// that the result overflows `tensor_dtype`.
absl::StatusOr<Interval> CheckElementwiseBounds(
    const ParsedElementwise& program, Interval leaf, spec::DType tensor_dtype);

// "map[*4.60517, +-6.90776, exp, clamp(min=0.0001), v4 + v8]": each op on
// the previous value unless it names another.
std::string DescribeElementwise(const ParsedElementwise& program);

// The dtype RNG_MODE_PORTABLE makes a program's leaf in: float64 when the
// program computes in float64, else float32 (docs/portable-rng.md, 14).
spec::DType PortableLeafDtype(const ParsedElementwise& program);

// Widens [lo, hi] by a few units in the last place of `dtype`.
Interval Widen(Interval v, spec::DType dtype);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_ELEMENTWISE_H_
