#include "server/init/portable/elementwise.h"

#include <algorithm>
#include <thread>

#include "server/init/portable/elementwise_math.h"
#include "server/init/portable/exact_math.h"

namespace materializer::init::portable {
namespace {

// Elements evaluated together: each op runs over a block before the next,
// so the per-op dispatch is paid once per block and the inner loops are
// plain array loops.
constexpr int64_t kBlock = 256;
// Below this many elements a second thread costs more than it saves.
constexpr int64_t kMinPerThread = int64_t{1} << 15;

void RunRange(const std::vector<ElementwiseOpDesc>& ops, const double* leaf,
              double* out, int64_t begin, int64_t end) {
  const size_t values = ops.size() + 1;
  std::vector<double> regs(values * kBlock);
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t m = std::min(kBlock, end - start);
    std::copy(leaf + start, leaf + start + m, regs.data());
    for (size_t k = 0; k < ops.size(); ++k) {
      const ElementwiseOpDesc& op = ops[k];
      const double* x = regs.data() + op.x * kBlock;
      const double* y = op.y >= 0 ? regs.data() + op.y * kBlock : nullptr;
      double* r = regs.data() + (k + 1) * kBlock;
      for (int64_t i = 0; i < m; ++i) {
        r[i] = ApplyElementwiseOp(op, x[i], y != nullptr ? y[i] : op.c);
      }
    }
    const double* last = regs.data() + ops.size() * kBlock;
    std::copy(last, last + m, out + start);
  }
}

}  // namespace

double ApplyElementwiseOp(const ElementwiseOpDesc& op, double x, double y) {
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

void RunElementwiseF64(const std::vector<ElementwiseOpDesc>& ops,
                       const double* leaf, double* out, int64_t n,
                       int threads) {
  if (n <= 0) return;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads, n / kMinPerThread));
  if (parts == 1) {
    RunRange(ops, leaf, out, 0, n);
    return;
  }
  // Whole blocks per thread, so each thread's blocks are those of one run.
  const int64_t per = ((n + parts - 1) / parts + kBlock - 1) / kBlock * kBlock;
  std::vector<std::thread> pool;
  for (int64_t begin = per; begin < n; begin += per) {
    pool.emplace_back(RunRange, std::cref(ops), leaf, out, begin,
                      std::min(n, begin + per));
  }
  RunRange(ops, leaf, out, 0, std::min(n, per));
  for (std::thread& t : pool) t.join();
}

}  // namespace materializer::init::portable
