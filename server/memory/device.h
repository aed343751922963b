#ifndef MATERIALIZER_SERVER_MEMORY_DEVICE_H_
#define MATERIALIZER_SERVER_MEMORY_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::memory {

enum class DeviceKind { kCpu, kCuda };

// One device of the pool.
struct DeviceConfig {
  // "cpu", "cpu:N" (virtual CPU devices) or "cuda:N"; the name clients use
  // in Placement.device.
  std::string name;
  DeviceKind kind = DeviceKind::kCpu;
  // CUDA ordinal, or the index of a virtual CPU device; 0 for "cpu".
  int ordinal = 0;
  // Bytes the pool may hand out on this device.
  uint64_t capacity_bytes = 0;
};

// Parses a device name: "cpu", "cuda" (= cuda:0) or "cuda:N".
absl::StatusOr<DeviceConfig> ParseDeviceName(absl::string_view text);

// Number of CUDA devices LibTorch can use here (0 without a driver/GPU).
int CudaDeviceCount();

// Total and free bytes of CUDA device `ordinal` from the CUDA runtime.
absl::Status CudaMemoryInfo(int ordinal, uint64_t* free_bytes,
                            uint64_t* total_bytes);

// Physical memory of this machine (or of its cgroup, whichever is lower).
uint64_t HostMemoryBytes();

struct PoolOptions {
  // "auto": every CUDA device LibTorch sees, else the CPU. Or a comma list
  // of device names: "cpu", "cuda:0,cuda:2", "cpu,cuda:0". "cpu:N" stands
  // for N virtual CPU devices, "cpu:0" ... "cpu:N-1", each with its own
  // capacity (multi-device placement without GPUs).
  std::string devices = "auto";
  // CPU capacity: a byte count ("16GiB") or a share of host memory ("75%").
  // With "cpu:N", one value is split equally among the N devices, or a
  // comma list gives each its own ("1GiB,2GiB,3GiB,4GiB").
  std::string cpu_capacity = "75%";
  // Per CUDA device: capacity is total device memory minus this reserve
  // (room for the CUDA context and LibTorch's own workspace).
  std::string cuda_reserve = "1GiB";
};

// Resolves PoolOptions into concrete devices with capacities.
// INVALID_ARGUMENT for unknown or unavailable devices and bad sizes.
absl::StatusOr<std::vector<DeviceConfig>> ConfigureDevices(
    const PoolOptions& options);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_DEVICE_H_
