#ifndef MATERIALIZER_SERVER_MEMORY_GPU_REPORT_H_
#define MATERIALIZER_SERVER_MEMORY_GPU_REPORT_H_

// GPU hygiene: who holds a GPU's memory, from the driver's process list and
// /proc. The server's own entry becomes server_process_bytes; everyone
// else is listed with a state, so a zombie (defunct) or a process that is
// gone while the driver still charges it stands out.
//
//   GpuReporter reporter(driver, GpuReporter::Options());
//   if (reporter.Covers(device)) {
//     ASSIGN_OR_RETURN(DriverReport r, reporter.Report(device));
//     for (const GpuProcessReport& p : r.other_processes) ...
//   }

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/memory/device.h"
#include "server/memory/gpu_driver.h"

namespace materializer::memory {

enum class ProcessState {
  kRunning,
  // A zombie: exited, not yet reaped by its parent.
  kDefunct,
  // No such process visible here: it exited (the driver still counts its
  // memory), or it lives in another pid namespace (another container).
  kGone,
};

// "running", "defunct", "gone" (the wire names of GpuProcess.state).
const char* ProcessStateName(ProcessState state);

struct ProcessInfo {
  ProcessState state = ProcessState::kGone;
  // /proc/<pid>/comm where readable, else "".
  std::string name;
};

// Reads /proc/<pid>/stat and comm under `proc_root`: state Z (or X) is
// defunct, a missing entry is gone, anything else running.
ProcessInfo InspectProcess(uint32_t pid,
                           const std::string& proc_root = "/proc");

struct GpuProcessReport {
  uint32_t pid = 0;
  std::string name;
  uint64_t used_bytes = 0;
  ProcessState state = ProcessState::kRunning;
};

struct DriverReport {
  std::string uuid;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  // The driver's figure for this server's own pid (0 if not listed).
  uint64_t server_process_bytes = 0;
  // Of that, what LibTorch's caching allocator has reserved.
  uint64_t caching_allocator_bytes = 0;
  // Every other process holding memory on the device, by pid.
  std::vector<GpuProcessReport> other_processes;
};

// Thread-safe; immutable. The driver must outlive it.
class GpuReporter {
 public:
  struct Options {
    // This server's pid as the driver sees it.
    uint32_t self_pid;
    std::string proc_root = "/proc";
    // Bytes LibTorch's caching allocator holds on a device; null: 0.
    std::function<uint64_t(const DeviceConfig&)> caching_allocator_bytes;
    Options();
  };

  GpuReporter(const GpuDriver* driver, Options options);

  bool Covers(const DeviceConfig& device) const {
    return driver_->Covers(device);
  }
  const GpuDriver& driver() const { return *driver_; }

  // The driver's figures for `device` with every process identified.
  // UNAVAILABLE when the driver cannot answer.
  absl::StatusOr<DriverReport> Report(const DeviceConfig& device) const;

 private:
  const GpuDriver* const driver_;
  const Options options_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_GPU_REPORT_H_
