// Stands in for cuda_bench_support.cu where nvcc was not found at build
// time (third_party/cuda): every call says so, and the benchmark reports it.

#include "server/init/portable/cuda_bench_support.h"

namespace materializer::init::portable::bench {
namespace {

CudaBenchStatus NotBuilt() {
  CudaBenchStatus status;
  status.code = -1;
  status.message =
      "this build has no CUDA code: nvcc was not found when it was built "
      "($CUDA_HOME under --config=cuda, else /usr/local/cuda)";
  return status;
}

}  // namespace

bool CudaBenchBuilt() { return false; }

CudaBenchStatus CudaDescribeDevice(int, std::string*, size_t*) {
  return NotBuilt();
}
CudaBenchStatus CudaAllocate(size_t, void**) { return NotBuilt(); }
CudaBenchStatus CudaRelease(void*) { return NotBuilt(); }
CudaBenchStatus CudaAllocatePinned(size_t, void**) { return NotBuilt(); }
CudaBenchStatus CudaReleasePinned(void*) { return NotBuilt(); }
CudaBenchStatus CudaStreamNew(CUstream_st**) { return NotBuilt(); }
CudaBenchStatus CudaStreamDelete(CUstream_st*) { return NotBuilt(); }
CudaBenchStatus TimeOnStream(CUstream_st*, int,
                             const std::function<bool(CUstream_st*)>&,
                             std::vector<double>*) {
  return NotBuilt();
}
CudaBenchStatus CudaMemsetOn(CUstream_st*, void*, int, size_t) {
  return NotBuilt();
}
CudaBenchStatus CudaCopyToHostOn(CUstream_st*, void*, const void*, size_t) {
  return NotBuilt();
}

}  // namespace materializer::init::portable::bench
