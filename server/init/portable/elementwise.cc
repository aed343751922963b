#include "server/init/portable/elementwise.h"

#include <algorithm>
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
internal::ElementwiseKernels PickKernels() {
#if defined(__x86_64__)
  const internal::ElementwiseKernels avx2 = internal::ElementwiseKernelsAvx2();
  if (avx2.f32 != nullptr && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    return avx2;
  }
#endif
  return internal::ElementwiseKernelsGeneric();
}

void RunRange(const std::vector<ElementwiseOpDesc>& ops, const float* leaf,
              float* out, int64_t n) {
  static const internal::ElementwiseKernels kernels = PickKernels();
  std::vector<float> regs((ops.size() + 1) * kElementwiseBlock);
  kernels.f32(ops, leaf, out, n, regs.data());
}

void RunRange(const std::vector<ElementwiseOpDesc>& ops, const double* leaf,
              double* out, int64_t n) {
  static const internal::ElementwiseKernels kernels = PickKernels();
  std::vector<double> regs((ops.size() + 1) * kElementwiseBlock);
  kernels.f64(ops, leaf, out, n, regs.data());
}

template <typename T>
void Run(const std::vector<ElementwiseOpDesc>& ops, const T* leaf, T* out,
         int64_t n, int threads) {
  if (n <= 0) return;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(threads, n / kMinPerThread));
  if (parts == 1) {
    RunRange(ops, leaf, out, n);
    return;
  }
  // Whole blocks per thread.
  const int64_t per = ((n + parts - 1) / parts + kElementwiseBlock - 1) /
                      kElementwiseBlock * kElementwiseBlock;
  std::vector<std::thread> pool;
  for (int64_t begin = per; begin < n; begin += per) {
    const int64_t count = std::min(n, begin + per) - begin;
    pool.emplace_back([&ops, leaf, out, begin, count] {
      RunRange(ops, leaf + begin, out + begin, count);
    });
  }
  RunRange(ops, leaf, out, std::min(n, per));
  for (std::thread& t : pool) t.join();
}

}  // namespace

double ApplyElementwiseOp(const ElementwiseOpDesc& op, double x, double y) {
  return ElementwiseOpValue(op, x, y);
}

float ApplyElementwiseOp(const ElementwiseOpDesc& op, float x, float y) {
  return ElementwiseOpValue(op, x, y);
}

void RunElementwise(const std::vector<ElementwiseOpDesc>& ops,
                    const double* leaf, double* out, int64_t n, int threads) {
  Run(ops, leaf, out, n, threads);
}

void RunElementwise(const std::vector<ElementwiseOpDesc>& ops,
                    const float* leaf, float* out, int64_t n, int threads) {
  Run(ops, leaf, out, n, threads);
}

}  // namespace materializer::init::portable
