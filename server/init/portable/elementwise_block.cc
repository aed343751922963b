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

// One op over a block in compute dtype T: the dispatch once, then a plain
// loop per kind. Constants and clamp bounds are rounded to T first.
template <typename T>
void RunOp(const ElementwiseOpDesc& op, const T* __restrict x,
           const T* __restrict y, T* __restrict r, int64_t m) {
  const T c = static_cast<T>(op.c);
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
    case ElementwiseKind::kDiv:
      if (y != nullptr) {
        for (int64_t i = 0; i < m; ++i) r[i] = Div(x[i], y[i]);
      } else if (op.constant_first) {
        for (int64_t i = 0; i < m; ++i) r[i] = Div(c, x[i]);
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = Div(x[i], c);
      }
      return;
    case ElementwiseKind::kReciprocal:
      for (int64_t i = 0; i < m; ++i) r[i] = Div(T(1), x[i]);
      return;
    case ElementwiseKind::kSqrt:
      for (int64_t i = 0; i < m; ++i) r[i] = Sqrt(x[i]);
      return;
    case ElementwiseKind::kClamp: {
      // ElementwiseOpValue's selects, one bound at a time.
      const T lo = static_cast<T>(op.min), hi = static_cast<T>(op.max);
      if (op.has_min && op.has_max) {
        for (int64_t i = 0; i < m; ++i) {
          const T v = x[i] < lo ? lo : x[i];
          r[i] = v > hi ? hi : v;
        }
      } else if (op.has_min) {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] < lo ? lo : x[i];
      } else if (op.has_max) {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i] > hi ? hi : x[i];
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = x[i];
      }
      return;
    }
    case ElementwiseKind::kNeg:
      for (int64_t i = 0; i < m; ++i) r[i] = -x[i];
      return;
    case ElementwiseKind::kExp:
      for (int64_t i = 0; i < m; ++i) r[i] = ExpOf(x[i]);
      return;
    case ElementwiseKind::kExpm1: {
      // Where the whole block is on one side of ln(2)/2, only that side is
      // computed (the values are Expm1F64's either way). A count, not two
      // flags, so that the test vectorizes.
      int64_t small = 0;
      for (int64_t i = 0; i < m; ++i) small += Expm1IsSmall(x[i]) ? 1 : 0;
      if (small == m) {
        for (int64_t i = 0; i < m; ++i) r[i] = Expm1SmallOf(x[i]);
      } else if (small == 0) {
        for (int64_t i = 0; i < m; ++i) r[i] = ExpOf(x[i]) - T(1);
      } else {
        for (int64_t i = 0; i < m; ++i) r[i] = Expm1Of(x[i]);
      }
      return;
    }
    case ElementwiseKind::kLog:
      for (int64_t i = 0; i < m; ++i) r[i] = LogOf(x[i]);
      return;
    case ElementwiseKind::kLog1p:
      for (int64_t i = 0; i < m; ++i) r[i] = Log1pOf(x[i]);
      return;
    case ElementwiseKind::kSoftplus:
      for (int64_t i = 0; i < m; ++i) r[i] = SoftplusOf(x[i]);
      return;
    default:
      for (int64_t i = 0; i < m; ++i) {
        r[i] = ElementwiseOpValue(op, x[i], y != nullptr ? y[i] : c);
      }
      return;
  }
}

// Runs the program over one block: value 0 is read straight from the
// leaf and the last op writes straight into `out`, unless that op reads
// the leaf and `out` is the leaf (in place), when it goes through the
// scratch value and a copy (RunOp's operands never alias its result).
template <typename T>
void RunBlock(const std::vector<ElementwiseOpDesc>& ops, const T* leaf, T* out,
              T* regs, int64_t m) {
  constexpr int64_t kB = internal::kElementwiseBlock;
  const size_t n_ops = ops.size();
  auto value = [&](int64_t v) -> const T* {
    return v == 0 ? leaf : regs + (v - 1) * kB;
  };
  for (size_t k = 0; k < n_ops; ++k) {
    const ElementwiseOpDesc& op = ops[k];
    const bool last = k + 1 == n_ops;
    const bool reads_leaf = op.x == 0 || op.y == 0;
    T* result = last && !(reads_leaf && out == leaf) ? out : regs + k * kB;
    RunOp(op, value(op.x), op.y >= 0 ? value(op.y) : nullptr, result, m);
    if (last && result != out) {
      for (int64_t i = 0; i < m; ++i) out[i] = result[i];
    }
  }
  if (n_ops == 0 && out != leaf) {
    for (int64_t i = 0; i < m; ++i) out[i] = leaf[i];
  }
}

template <typename T>
void RunRange(const std::vector<ElementwiseOpDesc>& ops, const T* leaf, T* out,
              int64_t n, void* scratch) {
  constexpr int64_t kB = internal::kElementwiseBlock;
  T* regs = static_cast<T*>(scratch);
  for (int64_t start = 0; start < n; start += kB) {
    const int64_t m = n - start < kB ? n - start : kB;
    RunBlock(ops, leaf + start, out + start, regs, m);
  }
}

}  // namespace
}  // namespace MAT_PORTABLE_ISA

namespace internal {
#if defined(MAT_ELEMENTWISE_AVX2)
ElementwiseKernels ElementwiseKernelsAvx2() {
  return {&RunRange<float>, &RunRange<double>};
}
#else
ElementwiseKernels ElementwiseKernelsGeneric() {
  return {&RunRange<float>, &RunRange<double>};
}
#endif
}  // namespace internal
}  // namespace materializer::init::portable
