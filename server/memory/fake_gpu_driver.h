#ifndef MATERIALIZER_SERVER_MEMORY_FAKE_GPU_DRIVER_H_
#define MATERIALIZER_SERVER_MEMORY_FAKE_GPU_DRIVER_H_

// A GpuDriver whose figures a test sets, for devices it names by pool name
// (usually virtual CPU devices standing in for GPUs, so admission against
// driver memory and the GetStats report are tested without a GPU):
//
//   FakeGpuDriver fake;
//   fake.Set("cpu:1", {.uuid = "GPU-fake-1", .total_bytes = 80 << 30, ...});
//
// or, for a whole server (materializerd --fake_gpu_driver=FILE), a JSON
// file read again on every sample, so a test changes the figures by
// rewriting it. Its format is GetStatsResponse's proto3 JSON, devices and
// their driver memory only (state and name of processes are ignored: the
// server reads them from /proc):
//
//   {"devices": [{"device": "cpu:1", "driver": {
//       "uuid": "GPU-fake-1", "name": "Fake GPU", "totalBytes": "85899345920",
//       "usedBytes": "...", "freeBytes": "...",
//       "processes": [{"pid": 4242, "usedBytes": "1073741824"}]}}]}

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/memory/gpu_driver.h"

namespace materializer::memory {

// Thread-safe.
class FakeGpuDriver final : public GpuDriver {
 public:
  // Figures set with Set().
  FakeGpuDriver() = default;
  // Figures read from `path` (format above) on every Sample and Covers;
  // INVALID_ARGUMENT if it does not parse now.
  static absl::StatusOr<std::unique_ptr<FakeGpuDriver>> FromFile(
      std::string path);

  // Reports `sample` for the device named `device`.
  void Set(const std::string& device, GpuMemorySample sample);
  // Stops reporting on `device`.
  void Remove(const std::string& device);
  // Sample() fails with `status` for every device until cleared with OK.
  void SetError(absl::Status status);

  bool Covers(const DeviceConfig& device) const override;
  absl::StatusOr<GpuMemorySample> Sample(const DeviceConfig& device,
                                         bool with_processes) const override;
  std::string Describe() const override;

 private:
  using Samples = std::map<std::string, GpuMemorySample>;
  absl::StatusOr<Samples> Current() const;

  std::string path_;  // empty: figures from Set()

  mutable absl::Mutex mu_;
  // Guards the figures and the error.
  Samples samples_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Parses the file format above. INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<std::map<std::string, GpuMemorySample>> ParseFakeGpuFile(
    const std::string& json);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_FAKE_GPU_DRIVER_H_
