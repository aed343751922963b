// Built twice (BUILD.bazel): as ElementwiseBlockGeneric, and with -mavx2
// -mfma as the function ElementwiseBlockAvx2() returns. -O3 and
// -fno-trapping-math let GCC vectorize the branch-free f64 functions of
// elementwise_math.h (selects computed on both sides); neither changes a
// result bit.
#include "server/init/portable/elementwise_block.h"

#include "server/init/portable/elementwise_op.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {
namespace {

// One op over a block: the dispatch once, then a plain loop per kind.
void RunOp(const ElementwiseOpDesc& op, const double* __restrict x,
           const double* __restrict y, double* __restrict r, int64_t m) {
  const double c = op.c;
  switch (op.kind) {
    case ElementwiseKind::kAdd:
      if (y != nullptr) {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] + y[i];
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] + c;
      }
      return;
    case ElementwiseKind::kSub:
      if (y != nullptr) {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] - y[i];
      } else if (op.constant_first) {
        for (int64_t i = 0; i < m; ++i) r[i] = c - x[i];
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] - c;
      }
      return;
    case ElementwiseKind::kMul:
      if (y != nullptr) {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] * y[i];
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] * c;
      }
      return;
    case ElementwiseKind::kNeg:
      for (int64_t i = 0; i < m; ++i) r[i] = -x[i];
      return;
    case ElementwiseKind::kExp:
      for (int64_t i = 0; i < m; ++i) r[i] = ExpF64(x[i]);
      return;
    case ElementwiseKind::kExpm1: {
      // Where the whole block is on one side of ln(2)/2, only that side is
      // computed (the values are Expm1F64's either way).
      bool all_small = true, none_small = true;
      for (int64_t i = 0; i < m; ++i) {
        const bool small = Expm1IsSmall(x[i]);
        all_small = all_small && small;
        none_small = none_small && !small;
      }
      if (all_small) {
        for (int64_t i = 0; i < m; ++i) r[i] = Expm1SmallF64(x[i]);
      } else if (none_small) {
        for (int64_t i = 0; i < m; ++i) r[i] = ExpF64(x[i]) - 1.0;
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = Expm1F64(x[i]);
      }
      return;
    }
    case ElementwiseKind::kLog:
      for (int64_t i = 0; i < m; ++i) r[i] = LogAnyF64(x[i]);
      return;
    case ElementwiseKind::kLog1p:
      for (int64_t i = 0; i < m; ++i) r[i] = Log1pF64(x[i]);
      return;
    case ElementwiseKind::kSoftplus:
      for (int64_t i = 0; i < m; ++i) r[i] = SoftplusF64(x[i]);
      return;
    default:
      for (int64_t i = 0; i < m; ++i) {
        r[i] = ElementwiseOpValue(op, x[i], y != nullptr ? y[i] : c);
      }
      return;
  }
}

void RunBlock(const std::vector<ElementwiseOpDesc>& ops, double* regs,
              int64_t m) {
  constexpr int64_t kB = internal::kElementwiseBlock;
  for (size_t k = 0; k < ops.size(); ++k) {
    const ElementwiseOpDesc& op = ops[k];
    RunOp(op, regs + op.x * kB, op.y >= 0 ? regs + op.y * kB : nullptr,
          regs + (k + 1) * kB, m);
  }
}

}  // namespace
}  // namespace MAT_PORTABLE_ISA

namespace internal {
#if defined(MAT_ELEMENTWISE_AVX2)
ElementwiseBlockFn ElementwiseBlockAvx2() { return &RunBlock; }
#else
void ElementwiseBlockGeneric(const std::vector<ElementwiseOpDesc>& ops,
                             double* regs, int64_t m) {
  RunBlock(ops, regs, m);
}
#endif
}  // namespace internal
}  // namespace materializer::init::portable
