// The CUDA kernel: the same header-only core (generate.h) as the CPU
// kernels, compiled by nvcc with --fmad=false (third_party/cuda builds it;
// portable_kernel_compile_test checks the PTX has no unfused arithmetic).
// One thread per Philox block (FillBoxBlock in generate.h, which
// portable_test also runs on the host for every block of several boxes): it
// computes the block's 4 (float64: 2) values and stores those inside the
// run. Consecutive threads take consecutive blocks of a group, whose values
// are consecutive elements, so stores coalesce.

#include <cuda_runtime.h>

#include <cstdio>

#include "server/init/portable/cuda_launch.h"
#include "server/init/portable/generate.h"

namespace materializer::init::portable {
namespace internal {
namespace {

template <Dist kDist, Format kFormat>
__global__ void PortableFillKernel(KernelParams k, RunLayout layout,
                                   int64_t blocks_per_run,
                                   typename Store<kFormat>::T* out) {
  const int64_t total = layout.num_runs * blocks_per_run;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < total; t += step) {
    FillBoxBlock<kDist, kFormat>(k, layout, blocks_per_run, t, out);
  }
}

CudaResult Result(cudaError_t error) {
  CudaResult result;
  result.code = static_cast<int>(error);
  if (error != cudaSuccess) {
    std::snprintf(result.message, sizeof(result.message), "%s: %s",
                  cudaGetErrorName(error), cudaGetErrorString(error));
  }
  return result;
}

template <Dist kDist, Format kFormat>
CudaResult Launch(const KernelParams& k, const RunLayout& layout, void* out,
                  cudaStream_t stream) {
  const int64_t blocks_per_run =
      BlocksPerRun(layout, kFormat == Format::kFloat64);
  const int64_t total = layout.num_runs * blocks_per_run;
  if (total == 0) return Result(cudaSuccess);
  constexpr int kThreads = 256;
  const int64_t grid = (total + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(
      grid < (int64_t{1} << 20) ? grid : (int64_t{1} << 20));
  PortableFillKernel<kDist, kFormat><<<blocks, kThreads, 0, stream>>>(
      k, layout, blocks_per_run, static_cast<typename Store<kFormat>::T*>(out));
  return Result(cudaGetLastError());
}

template <Dist kDist>
CudaResult LaunchFormat(const KernelParams& k, const RunLayout& layout,
                        void* out, cudaStream_t stream) {
  switch (k.format) {
    case Format::kFloat32:
      return Launch<kDist, Format::kFloat32>(k, layout, out, stream);
    case Format::kFloat64:
      return Launch<kDist, Format::kFloat64>(k, layout, out, stream);
    case Format::kBFloat16:
      return Launch<kDist, Format::kBFloat16>(k, layout, out, stream);
    case Format::kFloat16:
      return Launch<kDist, Format::kFloat16>(k, layout, out, stream);
    case Format::kFloat8E4M3FN:
      return Launch<kDist, Format::kFloat8E4M3FN>(k, layout, out, stream);
    case Format::kFloat8E5M2:
      return Launch<kDist, Format::kFloat8E5M2>(k, layout, out, stream);
  }
  return Result(cudaErrorInvalidValue);
}

}  // namespace

bool CudaKernelsBuilt() { return true; }

CudaResult CudaDeviceCount(int* count) {
  *count = 0;
  return Result(cudaGetDeviceCount(count));
}

CudaResult LaunchPortableFill(const KernelParams& k, const RunLayout& layout,
                              void* device_out, CUstream_st* stream) {
  switch (k.dist) {
    case Dist::kConstant:
      return LaunchFormat<Dist::kConstant>(k, layout, device_out, stream);
    case Dist::kUniform:
      return LaunchFormat<Dist::kUniform>(k, layout, device_out, stream);
    case Dist::kNormal:
      return LaunchFormat<Dist::kNormal>(k, layout, device_out, stream);
    case Dist::kTruncNormal:
      return LaunchFormat<Dist::kTruncNormal>(k, layout, device_out, stream);
  }
  return Result(cudaErrorInvalidValue);
}

CudaResult FillOnDevice(const KernelParams& k, const RunLayout& layout,
                        int device, void* device_out) {
  int previous = -1;
  cudaError_t error = cudaGetDevice(&previous);
  if (error != cudaSuccess) return Result(error);
  if (previous != device) {
    error = cudaSetDevice(device);
    if (error != cudaSuccess) return Result(error);
  }
  CudaResult result = LaunchPortableFill(k, layout, device_out, nullptr);
  if (result.code == 0) result = Result(cudaDeviceSynchronize());
  if (previous != device) {
    const cudaError_t restored = cudaSetDevice(previous);
    if (result.code == 0) result = Result(restored);
  }
  return result;
}

CudaResult FillViaDevice(const KernelParams& k, const RunLayout& layout,
                         int device, void* host_out, size_t bytes) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return Result(error);
  void* device_out = nullptr;
  if (bytes > 0) {
    error = cudaMalloc(&device_out, bytes);
    if (error != cudaSuccess) return Result(error);
  }
  CudaResult result = LaunchPortableFill(k, layout, device_out, nullptr);
  if (result.code == 0) result = Result(cudaDeviceSynchronize());
  if (result.code == 0 && bytes > 0) {
    result =
        Result(cudaMemcpy(host_out, device_out, bytes, cudaMemcpyDeviceToHost));
  }
  if (device_out != nullptr) cudaFree(device_out);
  return result;
}

}  // namespace internal
}  // namespace materializer::init::portable
