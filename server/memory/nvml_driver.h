#ifndef MATERIALIZER_SERVER_MEMORY_NVML_DRIVER_H_
#define MATERIALIZER_SERVER_MEMORY_NVML_DRIVER_H_

// The GpuDriver of a real NVIDIA driver: NVML, loaded with
// dlopen("libnvidia-ml.so.1") when the server starts, never linked, so the
// same binary runs on hosts without a GPU or driver.
//
//   absl::StatusOr<std::unique_ptr<GpuDriver>> nvml = LoadNvml();
//   if (!nvml.ok()) ... // no driver here: admission uses the ledger alone
//
// CUDA device N of this process is matched to its NVML device by PCI bus
// id (NVML numbers all GPUs of the host; CUDA only the visible ones). The
// pids NVML reports are the host's: in a container with its own pid
// namespace they do not match /proc here, so other processes show as
// "gone" and the server's own entry is not found (docs/operations.md).

#include <memory>

#include "absl/status/statusor.h"
#include "server/memory/gpu_driver.h"

namespace materializer::memory {

// UNAVAILABLE, saying why, when the library is missing or nvmlInit fails.
absl::StatusOr<std::unique_ptr<GpuDriver>> LoadNvml();

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_NVML_DRIVER_H_
