#include "server/memory/gpu_report.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace materializer::memory {

const char* ProcessStateName(ProcessState state) {
  switch (state) {
    case ProcessState::kRunning:
      return "running";
    case ProcessState::kDefunct:
      return "defunct";
    case ProcessState::kGone:
      return "gone";
  }
  return "unknown";
}

ProcessInfo InspectProcess(uint32_t pid, const std::string& proc_root) {
  ProcessInfo info;
  if (pid == 0) return info;  // never a real process
  const std::string dir = absl::StrCat(proc_root, "/", pid);
  std::ifstream stat(dir + "/stat");
  if (!stat) {
    // No entry: gone. An entry we may not read: alive, but we cannot say
    // more (hidepid mounts).
    if (access(dir.c_str(), F_OK) == 0) info.state = ProcessState::kRunning;
    return info;
  }
  std::stringstream text;
  text << stat.rdbuf();
  // "<pid> (<comm>) <state> ...": comm may hold spaces and parentheses,
  // so the state follows the last ')'.
  const std::string line = text.str();
  const size_t close = line.rfind(')');
  char state = '?';
  if (close != std::string::npos && close + 2 < line.size()) {
    state = line[close + 2];
  }
  info.state = (state == 'Z' || state == 'X') ? ProcessState::kDefunct
                                              : ProcessState::kRunning;
  std::ifstream comm(dir + "/comm");
  if (comm && std::getline(comm, info.name)) {
    info.name = std::string(absl::StripTrailingAsciiWhitespace(info.name));
  } else if (close != std::string::npos) {
    const size_t open = line.find('(');
    if (open != std::string::npos && open < close) {
      info.name = line.substr(open + 1, close - open - 1);
    }
  }
  return info;
}

GpuReporter::Options::Options() : self_pid(static_cast<uint32_t>(getpid())) {}

GpuReporter::GpuReporter(const GpuDriver* driver, Options options)
    : driver_(driver), options_(std::move(options)) {}

absl::StatusOr<DriverReport> GpuReporter::Report(
    const DeviceConfig& device) const {
  absl::StatusOr<GpuMemorySample> sample =
      driver_->Sample(device, /*with_processes=*/true);
  if (!sample.ok()) return sample.status();
  DriverReport report;
  report.uuid = std::move(sample->uuid);
  report.name = std::move(sample->name);
  report.total_bytes = sample->total_bytes;
  report.used_bytes = sample->used_bytes;
  report.free_bytes = sample->free_bytes;
  for (const GpuProcessUse& use : sample->processes) {
    if (use.pid == options_.self_pid) {
      report.server_process_bytes += use.used_bytes;
      continue;
    }
    ProcessInfo info = InspectProcess(use.pid, options_.proc_root);
    report.other_processes.push_back(
        {use.pid, std::move(info.name), use.used_bytes, info.state});
  }
  std::sort(report.other_processes.begin(), report.other_processes.end(),
            [](const GpuProcessReport& a, const GpuProcessReport& b) {
              return a.pid < b.pid;
            });
  if (options_.caching_allocator_bytes) {
    report.caching_allocator_bytes = options_.caching_allocator_bytes(device);
  }
  return report;
}

}  // namespace materializer::memory
