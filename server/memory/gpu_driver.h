#ifndef MATERIALIZER_SERVER_MEMORY_GPU_DRIVER_H_
#define MATERIALIZER_SERVER_MEMORY_GPU_DRIVER_H_

// A GPU's memory as its driver sees it, behind an interface: NVML in the
// server (nvml_driver.h, loaded at run time so CPU-only hosts run
// unchanged), a fake in tests (fake_gpu_driver.h). The ledger counts what
// this server handed out; the driver also counts what everyone else holds
// (other trainers, and the zombies that motivated this project), which is
// what admission (pool.h) and GetStats (gpu_report.h) need to see.
//
//   std::unique_ptr<GpuDriver> driver = ...;
//   if (driver->Covers(device)) {
//     ASSIGN_OR_RETURN(GpuMemorySample s,
//                      driver->Sample(device, /*with_processes=*/false));
//     ... s.free_bytes ...
//   }

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/memory/device.h"

namespace materializer::memory {

// One process with memory on a GPU, as the driver charges it.
struct GpuProcessUse {
  uint32_t pid = 0;
  // 0 where the driver cannot say (e.g. some virtualized setups).
  uint64_t used_bytes = 0;
};

struct GpuMemorySample {
  // "GPU-..." and the product name.
  std::string uuid;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  // Every process with memory on the device (this server included); empty
  // unless asked for.
  std::vector<GpuProcessUse> processes;
};

// Implementations are thread-safe.
class GpuDriver {
 public:
  virtual ~GpuDriver() = default;

  // Whether this driver reports on `device` (NVML: CUDA devices).
  virtual bool Covers(const DeviceConfig& device) const = 0;

  // The device's memory now; with the process list if `with_processes`
  // (slower: admission asks without). UNAVAILABLE when the driver cannot
  // answer; callers then fall back to the ledger alone.
  virtual absl::StatusOr<GpuMemorySample> Sample(const DeviceConfig& device,
                                                 bool with_processes) const = 0;

  // For the start-up log: "NVML 12.550.54.15 (driver ...)", "fake ...".
  virtual std::string Describe() const = 0;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_GPU_DRIVER_H_
