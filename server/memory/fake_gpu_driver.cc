#include "server/memory/fake_gpu_driver.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::memory {

absl::StatusOr<std::map<std::string, GpuMemorySample>> ParseFakeGpuFile(
    const std::string& json) {
  v1::GetStatsResponse parsed;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &parsed);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake GPU driver file: ", status.ToString()));
  }
  std::map<std::string, GpuMemorySample> samples;
  for (const v1::DeviceStats& device : parsed.devices()) {
    if (device.device().empty() || !device.has_driver()) {
      return absl::InvalidArgumentError(
          "fake GPU driver file: every entry of devices needs \"device\" and "
          "\"driver\"");
    }
    const v1::DriverMemory& driver = device.driver();
    GpuMemorySample sample;
    sample.uuid = driver.uuid();
    sample.name = driver.name();
    sample.total_bytes = driver.total_bytes();
    sample.used_bytes = driver.used_bytes();
    sample.free_bytes = driver.free_bytes();
    for (const v1::GpuProcess& process : driver.processes()) {
      sample.processes.push_back({process.pid(), process.used_bytes()});
    }
    if (!samples.emplace(device.device(), std::move(sample)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fake GPU driver file: device \"", device.device(),
          "\" is listed twice"));
    }
  }
  return samples;
}

absl::StatusOr<std::unique_ptr<FakeGpuDriver>> FakeGpuDriver::FromFile(
    std::string path) {
  auto driver = std::make_unique<FakeGpuDriver>();
  driver->path_ = std::move(path);
  absl::StatusOr<Samples> now = driver->Current();
  if (!now.ok()) return now.status();
  return driver;
}

absl::StatusOr<FakeGpuDriver::Samples> FakeGpuDriver::Current() const {
  if (path_.empty()) {
    absl::MutexLock lock(&mu_);
    return samples_;
  }
  std::ifstream file(path_);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the fake GPU driver file ", path_));
  }
  std::stringstream text;
  text << file.rdbuf();
  return ParseFakeGpuFile(text.str());
}

void FakeGpuDriver::Set(const std::string& device, GpuMemorySample sample) {
  absl::MutexLock lock(&mu_);
  samples_[device] = std::move(sample);
}

void FakeGpuDriver::Remove(const std::string& device) {
  absl::MutexLock lock(&mu_);
  samples_.erase(device);
}

void FakeGpuDriver::SetError(absl::Status status) {
  absl::MutexLock lock(&mu_);
  error_ = std::move(status);
}

bool FakeGpuDriver::Covers(const DeviceConfig& device) const {
  absl::StatusOr<Samples> samples = Current();
  return samples.ok() && samples->count(device.name) > 0;
}

absl::StatusOr<GpuMemorySample> FakeGpuDriver::Sample(
    const DeviceConfig& device, bool with_processes) const {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  absl::StatusOr<Samples> samples = Current();
  if (!samples.ok()) return absl::UnavailableError(samples.status().message());
  auto it = samples->find(device.name);
  if (it == samples->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fake GPU driver has no figures for ", device.name));
  }
  GpuMemorySample sample = std::move(it->second);
  if (!with_processes) sample.processes.clear();
  return sample;
}

std::string FakeGpuDriver::Describe() const {
  return path_.empty() ? "fake GPU driver"
                       : absl::StrCat("fake GPU driver (", path_, ")");
}

}  // namespace materializer::memory
