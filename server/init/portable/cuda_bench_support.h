#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_BENCH_SUPPORT_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_BENCH_SUPPORT_H_

// The CUDA runtime calls the GPU benchmark (portable_cuda_bench) needs
// around FillPortableCuda: device buffers, a stream, event timing, and the
// two baselines it is compared with (cudaMemsetAsync, the device's write
// bandwidth limit; a device-to-pinned-host copy, the ceiling of a fetch).
// nvcc-built where nvcc is found (third_party/cuda); elsewhere every call
// reports that. Plain C++ types only, so callers need no CUDA headers.
//
//   CudaBenchStatus s = CudaAllocate(0, bytes, &data);
//   std::vector<double> seconds;
//   s = TimeOnStream(stream, reps, [&](CUstream_st* st) {
//     return FillPortableCuda(request, data, st).ok();
//   }, &seconds);
//
// Not thread-safe: one benchmark drives one device from one thread.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace materializer::init::portable::bench {

struct CudaBenchStatus {
  // 0: success; a cudaError_t value; -1: this build has no CUDA code;
  // -2: the enqueue callback failed.
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

// Whether this build has the CUDA code (false for the stub).
bool CudaBenchBuilt();

// The device's name and total memory (cudaGetDeviceProperties); also makes
// `device` current.
CudaBenchStatus CudaDescribeDevice(int device, std::string* name,
                                   size_t* total_bytes);

CudaBenchStatus CudaAllocate(size_t bytes, void** out);
CudaBenchStatus CudaRelease(void* data);
CudaBenchStatus CudaAllocatePinned(size_t bytes, void** out);
CudaBenchStatus CudaReleasePinned(void* data);
CudaBenchStatus CudaStreamNew(CUstream_st** out);
CudaBenchStatus CudaStreamDelete(CUstream_st* stream);

// Times `reps` runs of `enqueue` (which queues work on the stream and
// returns false on failure) with CUDA events around each run, after one
// untimed warm-up; appends each run's seconds.
CudaBenchStatus TimeOnStream(CUstream_st* stream, int reps,
                             const std::function<bool(CUstream_st*)>& enqueue,
                             std::vector<double>* seconds);

// Enqueues cudaMemsetAsync(data, value, bytes) on the stream.
CudaBenchStatus CudaMemsetOn(CUstream_st* stream, void* data, int value,
                             size_t bytes);

// Enqueues a device-to-host copy of `bytes` on the stream.
CudaBenchStatus CudaCopyToHostOn(CUstream_st* stream, void* host,
                                 const void* device, size_t bytes);

}  // namespace materializer::init::portable::bench

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_CUDA_BENCH_SUPPORT_H_
