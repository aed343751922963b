#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_CUDA_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_CUDA_H_

// The CUDA counterpart of FillPortable: the same bytes (the same core,
// compiled by nvcc), written to device memory. Built by nvcc wherever nvcc
// is found (third_party/cuda); elsewhere the functions return UNAVAILABLE
// saying so. No CUDA headers needed to include this one.
//
//   // On the caller's stream; `out` holds PortableOutputBytes(r) bytes.
//   RETURN_IF_ERROR(FillPortableCuda(r, out, stream));

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/init/portable/portable.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace materializer::init::portable {

// Whether this build has the CUDA kernels.
bool PortableCudaBuilt();

// Number of CUDA devices; UNAVAILABLE (with CUDA's reason: no driver, no
// device, not built) when there is none to use.
absl::StatusOr<int> PortableCudaDeviceCount();

// Enqueues the fill on `stream` (nullptr: the legacy default stream) of
// the current device and returns; `device_out` must stay allocated until
// the stream passes this point. Request errors are INVALID_ARGUMENT, as
// FillPortable's; launch errors INTERNAL with CUDA's message. Thread-safe.
absl::Status FillPortableCuda(const PortableRequest& request, void* device_out,
                              CUstream_st* stream);

// Fills `device_out`, memory of CUDA device `device`, and waits until the
// fill is done, with that device current for the launch (the calling
// thread's current device is restored). What the server's init uses: a
// worker thread's current device says nothing about where a tensor lives.
absl::Status FillPortableCudaOn(const PortableRequest& request, int device,
                                void* device_out);

// Fills on `device` and copies the bytes to host memory `host_out`;
// synchronous. For tests and tools (the CUDA-vs-CPU bit-equality test).
absl::Status FillPortableCudaToHost(const PortableRequest& request,
                                    void* host_out, int device = 0);

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_PORTABLE_CUDA_H_
