// CUDA runtime calls for portable_cuda_bench (cuda_bench_support.h).

#include <cuda_runtime.h>

#include "server/init/portable/cuda_bench_support.h"

namespace materializer::init::portable::bench {
namespace {

CudaBenchStatus Status(cudaError_t error) {
  CudaBenchStatus status;
  status.code = static_cast<int>(error);
  if (error != cudaSuccess) {
    status.message =
        std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
  }
  return status;
}

}  // namespace

bool CudaBenchBuilt() { return true; }

CudaBenchStatus CudaDescribeDevice(int device, std::string* name,
                                   size_t* total_bytes) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return Status(error);
  cudaDeviceProp properties;
  error = cudaGetDeviceProperties(&properties, device);
  if (error != cudaSuccess) return Status(error);
  *name = properties.name;
  *total_bytes = properties.totalGlobalMem;
  return Status(cudaSuccess);
}

CudaBenchStatus CudaAllocate(size_t bytes, void** out) {
  return Status(cudaMalloc(out, bytes));
}

CudaBenchStatus CudaRelease(void* data) { return Status(cudaFree(data)); }

CudaBenchStatus CudaAllocatePinned(size_t bytes, void** out) {
  return Status(cudaHostAlloc(out, bytes, cudaHostAllocDefault));
}

CudaBenchStatus CudaReleasePinned(void* data) {
  return Status(cudaFreeHost(data));
}

CudaBenchStatus CudaStreamNew(CUstream_st** out) {
  return Status(cudaStreamCreateWithFlags(out, cudaStreamNonBlocking));
}

CudaBenchStatus CudaStreamDelete(CUstream_st* stream) {
  return Status(cudaStreamDestroy(stream));
}

CudaBenchStatus TimeOnStream(CUstream_st* stream, int reps,
                             const std::function<bool(CUstream_st*)>& enqueue,
                             std::vector<double>* seconds) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cudaError_t error = cudaEventCreate(&start);
  if (error == cudaSuccess) error = cudaEventCreate(&stop);
  CudaBenchStatus status = Status(error);
  // One untimed warm-up (module loading, first-touch of the pages).
  if (status.ok() && !enqueue(stream)) {
    status.code = -2;
    status.message = "the enqueued work failed";
  }
  if (status.ok()) status = Status(cudaStreamSynchronize(stream));
  for (int i = 0; status.ok() && i < reps; ++i) {
    error = cudaEventRecord(start, stream);
    if (error != cudaSuccess) {
      status = Status(error);
      break;
    }
    if (!enqueue(stream)) {
      status.code = -2;
      status.message = "the enqueued work failed";
      break;
    }
    error = cudaEventRecord(stop, stream);
    if (error == cudaSuccess) error = cudaEventSynchronize(stop);
    float ms = 0;
    if (error == cudaSuccess) error = cudaEventElapsedTime(&ms, start, stop);
    if (error != cudaSuccess) {
      status = Status(error);
      break;
    }
    seconds->push_back(static_cast<double>(ms) / 1e3);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  return status;
}

CudaBenchStatus CudaMemsetOn(CUstream_st* stream, void* data, int value,
                             size_t bytes) {
  return Status(cudaMemsetAsync(data, value, bytes, stream));
}

CudaBenchStatus CudaCopyToHostOn(CUstream_st* stream, void* host,
                                 const void* device, size_t bytes) {
  return Status(
      cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
}

}  // namespace materializer::init::portable::bench
