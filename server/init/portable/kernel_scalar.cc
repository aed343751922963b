// The baseline kernel: one block at a time, any x86-64 (or other) CPU.

#include "server/init/portable/cpu_kernels.h"
#include "server/init/portable/generate.h"
#include "server/init/portable/kernel_table.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {
namespace {

template <Dist kDist, Format kFormat>
struct ScalarKernel {
  static void Run(const KernelParams& k, int64_t i0, int64_t n, void* out) {
    FillRunScalar<kDist, kFormat>(
        k, i0, n, static_cast<typename Store<kFormat>::T*>(out));
  }
};

}  // namespace
}  // namespace MAT_PORTABLE_ISA

namespace internal {

FillRunFn ScalarFillRun(Dist dist, Format format) {
  return PickKernel<ScalarKernel>(dist, format);
}

}  // namespace internal
}  // namespace materializer::init::portable
