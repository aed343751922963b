#include "server/memory/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <ATen/Context.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/common/units.h"

namespace materializer::memory {

absl::StatusOr<DeviceConfig> ParseDeviceName(absl::string_view text) {
  DeviceConfig config;
  if (text == "cpu") {
    config.name = "cpu";
    config.kind = DeviceKind::kCpu;
    return config;
  }
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda")) {
    int ordinal = 0;
    if (rest.empty() ||
        (absl::ConsumePrefix(&rest, ":") && absl::SimpleAtoi(rest, &ordinal) &&
         ordinal >= 0 && ordinal < 1024 &&
         absl::StrCat(ordinal) == rest)) {
      config.name = absl::StrCat("cuda:", ordinal);
      config.kind = DeviceKind::kCuda;
      config.ordinal = ordinal;
      return config;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", text, "\" is not a device; expected \"cpu\" or \"cuda:N\""));
}

int CudaDeviceCount() {
  int count = 0;
  const absl::Status status = GuardTorch("counting CUDA devices", [&] {
    if (at::hasCUDA()) count = static_cast<int>(at::getNumGPUs());
  });
  return status.ok() ? count : 0;
}

absl::Status CudaMemoryInfo(int ordinal, uint64_t* free_bytes,
                            uint64_t* total_bytes) {
  // The CUDA runtime is already loaded by LibTorch's CUDA backend when a
  // device exists; look it up rather than linking it, so the same binary runs
  // on machines without CUDA.
  using SetDevice = int (*)(int);
  using GetDevice = int (*)(int*);
  using MemGetInfo = int (*)(size_t*, size_t*);
  void* runtime = nullptr;
  for (const char* name : {"libcudart.so.13", "libcudart.so.12",
                           "libcudart.so"}) {
    runtime = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
    if (runtime != nullptr) break;
  }
  if (runtime == nullptr) {
    return absl::UnavailableError("the CUDA runtime is not loaded");
  }
  auto set_device = reinterpret_cast<SetDevice>(dlsym(runtime, "cudaSetDevice"));
  auto get_device = reinterpret_cast<GetDevice>(dlsym(runtime, "cudaGetDevice"));
  auto mem_get_info =
      reinterpret_cast<MemGetInfo>(dlsym(runtime, "cudaMemGetInfo"));
  if (set_device == nullptr || get_device == nullptr ||
      mem_get_info == nullptr) {
    dlclose(runtime);
    return absl::UnavailableError("the CUDA runtime lacks cudaMemGetInfo");
  }
  int previous = 0;
  get_device(&previous);
  size_t free_size = 0;
  size_t total_size = 0;
  int error = set_device(ordinal);
  if (error == 0) error = mem_get_info(&free_size, &total_size);
  set_device(previous);
  dlclose(runtime);
  if (error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cudaMemGetInfo(cuda:", ordinal, ") failed: error ",
                     error));
  }
  *free_bytes = free_size;
  *total_bytes = total_size;
  return absl::OkStatus();
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  uint64_t bytes = pages > 0 && page_size > 0
                       ? static_cast<uint64_t>(pages) *
                             static_cast<uint64_t>(page_size)
                       : 0;
  // A container's memory limit (cgroup v2, then v1) is the real ceiling.
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    std::string text;
    uint64_t limit = 0;
    if (file >> text && absl::SimpleAtoi(text, &limit) && limit > 0 &&
        limit < bytes) {
      bytes = limit;
    }
  }
  return bytes;
}

namespace {

absl::StatusOr<uint64_t> CpuCapacity(absl::string_view text) {
  absl::string_view percent = text;
  if (absl::ConsumeSuffix(&percent, "%")) {
    double share = 0;
    if (!absl::SimpleAtod(percent, &share) || !(share > 0) || share > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cpu capacity \"", text, "\": a percentage must be in (0, 100]"));
    }
    return static_cast<uint64_t>(static_cast<double>(HostMemoryBytes()) *
                                 share / 100.0);
  }
  absl::StatusOr<uint64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu capacity: ", bytes.status().message()));
  }
  return *bytes;
}

// Capacities of `count` virtual CPU devices: one value split equally, or one
// value per device.
absl::StatusOr<std::vector<uint64_t>> VirtualCpuCapacities(
    absl::string_view text, int count) {
  const std::vector<std::string> parts =
      absl::StrSplit(text, ',', absl::SkipWhitespace());
  std::vector<uint64_t> capacities;
  if (parts.size() == 1) {
    ASSIGN_OR_RETURN(uint64_t total, CpuCapacity(parts[0]));
    capacities.assign(count, total / static_cast<uint64_t>(count));
    return capacities;
  }
  if (static_cast<int>(parts.size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu capacity \"", text, "\" lists ", parts.size(),
        " values for ", count, " virtual CPU devices"));
  }
  for (const std::string& part : parts) {
    ASSIGN_OR_RETURN(uint64_t capacity, CpuCapacity(part));
    capacities.push_back(capacity);
  }
  return capacities;
}

}  // namespace

absl::StatusOr<std::vector<DeviceConfig>> ConfigureDevices(
    const PoolOptions& options) {
  const int cuda_count = CudaDeviceCount();
  std::vector<std::string> names;
  if (options.devices.empty() || options.devices == "auto") {
    for (int i = 0; i < cuda_count; ++i) names.push_back(absl::StrCat("cuda:", i));
    if (names.empty()) names.push_back("cpu");
  } else {
    names = absl::StrSplit(options.devices, ',', absl::SkipWhitespace());
  }
  absl::StatusOr<uint64_t> cuda_reserve = ParseBytes(options.cuda_reserve);
  if (!cuda_reserve.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda reserve: ", cuda_reserve.status().message()));
  }
  std::vector<DeviceConfig> devices;
  for (const std::string& raw : names) {
    const absl::string_view name = absl::StripAsciiWhitespace(raw);
    absl::string_view count_text = name;
    if (absl::ConsumePrefix(&count_text, "cpu:")) {
      int count = 0;
      if (!absl::SimpleAtoi(count_text, &count) || count < 1 || count > 64) {
        return absl::InvalidArgumentError(absl::StrCat(
            "devices: \"", name,
            "\": cpu:N asks for N virtual CPU devices, 1 <= N <= 64"));
      }
      ASSIGN_OR_RETURN(std::vector<uint64_t> capacities,
                       VirtualCpuCapacities(options.cpu_capacity, count));
      for (int i = 0; i < count; ++i) {
        DeviceConfig device;
        device.name = absl::StrCat("cpu:", i);
        device.kind = DeviceKind::kCpu;
        device.ordinal = i;
        device.capacity_bytes = capacities[i];
        devices.push_back(std::move(device));
      }
      continue;
    }
    ASSIGN_OR_RETURN(DeviceConfig device, ParseDeviceName(name));
    if (device.kind == DeviceKind::kCpu) {
      ASSIGN_OR_RETURN(device.capacity_bytes, CpuCapacity(options.cpu_capacity));
    } else {
      if (device.ordinal >= cuda_count) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device ", device.name, " is not available: this machine has ",
            cuda_count, " CUDA device(s) visible to LibTorch"));
      }
      uint64_t free_bytes = 0;
      uint64_t total_bytes = 0;
      RETURN_IF_ERROR(CudaMemoryInfo(device.ordinal, &free_bytes, &total_bytes));
      device.capacity_bytes =
          total_bytes > *cuda_reserve ? total_bytes - *cuda_reserve : 0;
    }
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace materializer::memory
