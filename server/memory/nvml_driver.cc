#include "server/memory/nvml_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace materializer::memory {
namespace {

// The parts of nvml.h we use, declared here so that no NVML header or
// library is needed to build. Layouts are NVML's stable ABI.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;  // NOLINT

struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total;  // NOLINT
  unsigned long long free;   // NOLINT
  unsigned long long used;   // NOLINT
};

struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2 layout, used by _v3)
  unsigned int pid;
  unsigned long long used_gpu_memory;  // NOLINT
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

struct NvmlApi {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*driver_version)(char*, unsigned int);
  NvmlReturn (*by_pci_bus_id)(const char*, NvmlDevice*);
  NvmlReturn (*by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*memory_info)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*name)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*compute_processes)(NvmlDevice, unsigned int*, NvmlProcessInfo*);
  // Optional: graphics contexts (e.g. a display server) also hold memory.
  NvmlReturn (*graphics_processes)(NvmlDevice, unsigned int*,
                                   NvmlProcessInfo*);
};

// cudaDeviceGetPCIBusId from the CUDA runtime LibTorch has loaded, if any.
using PciBusIdFn = int (*)(char*, int, int);

PciBusIdFn CudaPciBusId() {
  for (const char* name :
       {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (void* runtime = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) {
      return reinterpret_cast<PciBusIdFn>(
          dlsym(runtime, "cudaDeviceGetPCIBusId"));
    }
  }
  return nullptr;
}

class NvmlDriver final : public GpuDriver {
 public:
  explicit NvmlDriver(NvmlApi api) : api_(api), pci_bus_id_(CudaPciBusId()) {}

  ~NvmlDriver() override {
    api_.shutdown();
    // The library stays loaded: NVML's own threads may still be winding
    // down.
  }

  bool Covers(const DeviceConfig& device) const override {
    return device.kind == DeviceKind::kCuda;
  }

  absl::StatusOr<GpuMemorySample> Sample(const DeviceConfig& device,
                                         bool with_processes) const override {
    if (!Covers(device)) {
      return absl::InvalidArgumentError(
          absl::StrCat(device.name, " is not a CUDA device"));
    }
    absl::StatusOr<NvmlDevice> handle = Handle(device.ordinal);
    if (!handle.ok()) return handle.status();
    GpuMemorySample sample;
    NvmlMemory memory{};
    if (NvmlReturn r = api_.memory_info(*handle, &memory); r != kNvmlSuccess) {
      return Error("nvmlDeviceGetMemoryInfo", device, r);
    }
    sample.total_bytes = memory.total;
    sample.free_bytes = memory.free;
    sample.used_bytes = memory.used;
    char text[96] = {};
    if (api_.name(*handle, text, sizeof(text)) == kNvmlSuccess) {
      sample.name = text;
    }
    if (api_.uuid(*handle, text, sizeof(text)) == kNvmlSuccess) {
      sample.uuid = text;
    }
    if (!with_processes) return sample;
    if (absl::Status s = AddProcesses(api_.compute_processes, *handle,
                                      device, &sample);
        !s.ok()) {
      return s;
    }
    if (api_.graphics_processes != nullptr) {
      // A process with both kinds of context is listed once, with the
      // larger figure (NVML charges the same memory to both lists).
      GpuMemorySample graphics;
      if (AddProcesses(api_.graphics_processes, *handle, device, &graphics)
              .ok()) {
        for (const GpuProcessUse& g : graphics.processes) {
          auto it = std::find_if(
              sample.processes.begin(), sample.processes.end(),
              [&](const GpuProcessUse& p) { return p.pid == g.pid; });
          if (it == sample.processes.end()) {
            sample.processes.push_back(g);
          } else {
            it->used_bytes = std::max(it->used_bytes, g.used_bytes);
          }
        }
      }
    }
    return sample;
  }

  std::string Describe() const override {
    char version[96] = {};
    if (api_.driver_version != nullptr &&
        api_.driver_version(version, sizeof(version)) == kNvmlSuccess) {
      return absl::StrCat("NVML (driver ", version, ")");
    }
    return "NVML";
  }

 private:
  absl::Status Error(const char* call, const DeviceConfig& device,
                     NvmlReturn r) const {
    return absl::UnavailableError(absl::StrCat(
        call, "(", device.name, ") failed: ",
        api_.error_string != nullptr ? api_.error_string(r) : "error",
        " (", r, ")"));
  }

  // The NVML device of CUDA ordinal `ordinal`, found once by PCI bus id
  // (else by index, which is right only without CUDA_VISIBLE_DEVICES).
  absl::StatusOr<NvmlDevice> Handle(int ordinal) const {
    absl::MutexLock lock(&mu_);
    if (auto it = handles_.find(ordinal); it != handles_.end()) {
      return it->second;
    }
    NvmlDevice handle = nullptr;
    NvmlReturn r = -1;
    char bus_id[32] = {};
    if (pci_bus_id_ != nullptr &&
        pci_bus_id_(bus_id, sizeof(bus_id), ordinal) == 0) {
      r = api_.by_pci_bus_id(bus_id, &handle);
    }
    if (r != kNvmlSuccess) {
      r = api_.by_index(static_cast<unsigned int>(ordinal), &handle);
    }
    if (r != kNvmlSuccess) {
      return absl::UnavailableError(absl::StrCat(
          "NVML has no device for cuda:", ordinal, " (PCI bus id \"", bus_id,
          "\"): ",
          api_.error_string != nullptr ? api_.error_string(r) : "error"));
    }
    handles_[ordinal] = handle;
    return handle;
  }

  absl::Status AddProcesses(NvmlReturn (*list)(NvmlDevice, unsigned int*,
                                               NvmlProcessInfo*),
                            NvmlDevice handle, const DeviceConfig& device,
                            GpuMemorySample* sample) const {
    // The list can grow between the sizing call and the real one.
    std::vector<NvmlProcessInfo> infos(16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      unsigned int count = static_cast<unsigned int>(infos.size());
      const NvmlReturn r = list(handle, &count, infos.data());
      if (r == kNvmlInsufficientSize) {
        infos.resize(std::max<size_t>(count + 8, infos.size() * 2));
        continue;
      }
      if (r != kNvmlSuccess) {
        return Error("listing the processes of", device, r);
      }
      for (unsigned int i = 0; i < count; ++i) {
        GpuProcessUse use;
        use.pid = infos[i].pid;
        use.used_bytes = infos[i].used_gpu_memory == kNvmlValueNotAvailable
                             ? 0
                             : infos[i].used_gpu_memory;
        sample->processes.push_back(use);
      }
      return absl::OkStatus();
    }
    return absl::UnavailableError(absl::StrCat(
        "the process list of ", device.name, " kept growing"));
  }

  const NvmlApi api_;
  const PciBusIdFn pci_bus_id_;

  mutable absl::Mutex mu_;
  // Guards handles_: NVML device per CUDA ordinal, found on first use.
  mutable absl::flat_hash_map<int, NvmlDevice> handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuDriver>> LoadNvml() {
  void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("libnvidia-ml.so.1 cannot be loaded: ", dlerror()));
  }
  NvmlApi api{};
  bool missing = false;
  std::string missing_name;
  auto need = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(library, name));
    if (*fn == nullptr && !missing) {
      missing = true;
      missing_name = name;
    }
  };
  auto want = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(library, name));
  };
  need(&api.init, "nvmlInit_v2");
  need(&api.shutdown, "nvmlShutdown");
  want(&api.error_string, "nvmlErrorString");
  want(&api.driver_version, "nvmlSystemGetDriverVersion");
  need(&api.by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  need(&api.by_index, "nvmlDeviceGetHandleByIndex_v2");
  need(&api.memory_info, "nvmlDeviceGetMemoryInfo");
  need(&api.name, "nvmlDeviceGetName");
  need(&api.uuid, "nvmlDeviceGetUUID");
  want(&api.compute_processes, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (api.compute_processes == nullptr) {  // drivers before 510: same layout
    need(&api.compute_processes, "nvmlDeviceGetComputeRunningProcesses_v2");
  }
  want(&api.graphics_processes, "nvmlDeviceGetGraphicsRunningProcesses_v3");
  if (missing) {
    dlclose(library);
    return absl::UnavailableError(absl::StrCat(
        "libnvidia-ml.so.1 lacks ", missing_name, " (driver too old)"));
  }
  if (NvmlReturn r = api.init(); r != kNvmlSuccess) {
    const std::string why =
        api.error_string != nullptr ? api.error_string(r) : "error";
    dlclose(library);
    return absl::UnavailableError(
        absl::StrCat("nvmlInit failed: ", why, " (", r, ")"));
  }
  return std::unique_ptr<GpuDriver>(new NvmlDriver(api));
}

}  // namespace materializer::memory
