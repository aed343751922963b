// Stands in for portable_kernel.cu where nvcc was not found at build time
// (third_party/cuda): every call reports that, so callers and the GPU test
// can say why there is no CUDA path.

#include <cstdio>

#include "server/init/portable/cuda_launch.h"

namespace materializer::init::portable::internal {
namespace {

CudaResult NotBuilt() {
  CudaResult result;
  result.code = -1;
  std::snprintf(result.message, sizeof(result.message), "%s",
                "this build has no CUDA kernels: nvcc was not found when it "
                "was built ($CUDA_HOME under --config=cuda, else "
                "/usr/local/cuda)");
  return result;
}

}  // namespace

bool CudaKernelsBuilt() { return false; }

CudaResult CudaDeviceCount(int* count) {
  *count = 0;
  return NotBuilt();
}

CudaResult LaunchPortableFill(const KernelParams&, const RunLayout&, void*,
                              CUstream_st*) {
  return NotBuilt();
}

CudaResult FillOnDevice(const KernelParams&, const RunLayout&, int, void*) {
  return NotBuilt();
}

CudaResult FillViaDevice(const KernelParams&, const RunLayout&, int, void*,
                         size_t) {
  return NotBuilt();
}

}  // namespace materializer::init::portable::internal
