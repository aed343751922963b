#include "server/init/portable/elementwise.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "server/init/portable/elementwise_block.h"
#include "server/init/portable/elementwise_op.h"

namespace materializer::init::portable {
namespace {

using internal::kElementwiseBlock;

// Below this many elements a second thread costs more than it saves.
constexpr int64_t kMinPerThread = int64_t{1} << 15;

// The AVX2 + FMA build where this CPU has both, else the generic one (the
// same bits either way).
internal::ElementwiseBlockFn PickBlock() {
#if defined(__x86_64__)
  internal::ElementwiseBlockFn avx2 = internal::ElementwiseBlockAvx2();
  if (avx2 != nullptr && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    return avx2;
  }
#endif
  return &internal::ElementwiseBlockGeneric;
}

template <typename In, typename Out>
void RunRange(const std::vector<ElementwiseOpDesc>& ops,
              internal::ElementwiseBlockFn block, const In* leaf, Out* out,
              int64_t begin, int64_t end) {
  std::vector<double> regs((ops.size() + 1) * kElementwiseBlock);
  for (int64_t start = begin; start < end; start += kElementwiseBlock) {
    const int64_t m = std::min(kElementwiseBlock, end - start);
    for (int64_t i = 0; i < m; ++i) regs[i] = leaf[start + i];
    block(ops, regs.data(), m);
    const double* last = regs.data() + ops.size() * kElementwiseBlock;
    for (int64_t i = 0; i < m; ++i) out[start + i] = static_cast<Out>(last[i]);
  }
}

template <typename In, typename Out>
void Run(const std::vector<ElementwiseOpDesc>& ops, const In* leaf, Out* out,
         int64_t n, int threads) {
  if (n <= 0) return;
  static const internal::ElementwiseBlockFn block = PickBlock();
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads, n / kMinPerThread));
  if (parts == 1) {
    RunRange(ops, block, leaf, out, 0, n);
    return;
  }
  // Whole blocks per thread.
  const int64_t per = ((n + parts - 1) / parts + kElementwiseBlock - 1) /
                      kElementwiseBlock * kElementwiseBlock;
  std::vector<std::thread> pool;
  for (int64_t begin = per; begin < n; begin += per) {
    pool.emplace_back(RunRange<In, Out>, std::cref(ops), block, leaf, out,
                      begin, std::min(n, begin + per));
  }
  RunRange(ops, block, leaf, out, 0, std::min(n, per));
  for (std::thread& t : pool) t.join();
}

}  // namespace

double ApplyElementwiseOp(const ElementwiseOpDesc& op, double x, double y) {
  return ElementwiseOpValue(op, x, y);
}

void RunElementwiseF64(const std::vector<ElementwiseOpDesc>& ops,
                       const double* leaf, double* out, int64_t n,
                       int threads) {
  Run(ops, leaf, out, n, threads);
}

void RunElementwiseF64(const std::vector<ElementwiseOpDesc>& ops,
                       const float* leaf, float* out, int64_t n, int threads) {
  Run(ops, leaf, out, n, threads);
}

}  // namespace materializer::init::portable
