#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_LAUNCH_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_LAUNCH_H_

// The boundary between nvcc-compiled code (portable_kernel.cu) and the
// rest: plain C++ types only (no absl, no CUDA headers), so each side
// compiles without the other's headers. portable_kernel_stub.cc implements
// the same functions where nvcc was not found. Internal to the library;
// portable_cuda.h is the API.

#include <cstddef>

#include "server/init/portable/kernel_params.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace materializer::init::portable::internal {

struct CudaResult {
  // 0: success; otherwise a cudaError_t value, or -1 for "not built".
  int code = 0;
  char message[256] = {};
};

// Whether this build has the CUDA kernels (false for the stub).
bool CudaKernelsBuilt();

// cudaGetDeviceCount.
CudaResult CudaDeviceCount(int* count);

// Enqueues the fill of `layout` into device memory `device_out` (dense, box
// order, element type per k.format) on `stream`; returns launch errors.
CudaResult LaunchPortableFill(const KernelParams& k, const RunLayout& layout,
                              void* device_out, CUstream_st* stream);

// Fills device memory `device_out` of CUDA device `device` and waits for
// it: the launch and the wait run with `device` current (a kernel launched
// on whichever device the calling thread had current would write another
// GPU's memory), and the thread's current device is restored afterwards.
CudaResult FillOnDevice(const KernelParams& k, const RunLayout& layout,
                        int device, void* device_out);

// Synchronous round trip for tests and tools: allocates `bytes` on
// `device`, fills, copies to host_out, frees.
CudaResult FillViaDevice(const KernelParams& k, const RunLayout& layout,
                         int device, void* host_out, size_t bytes);

}  // namespace materializer::init::portable::internal

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_LAUNCH_H_
