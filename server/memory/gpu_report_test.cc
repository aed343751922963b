#include "server/memory/gpu_report.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/fake_gpu_driver.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A pid no process can have: above the kernel's pid_max.
uint32_t ImpossiblePid() {
  std::ifstream f("/proc/sys/kernel/pid_max");
  uint64_t max = 4194304;
  f >> max;
  return static_cast<uint32_t>(max + 1000);
}

// A child that exits at once and is not reaped: a zombie until Reap().
class Zombie {
 public:
  Zombie() {
    pid_ = fork();
    if (pid_ == 0) _exit(0);
    // Wait until the kernel shows it as exited (without reaping it).
    siginfo_t info{};
    waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT);
  }
  ~Zombie() { waitpid(pid_, nullptr, 0); }
  uint32_t pid() const { return static_cast<uint32_t>(pid_); }

 private:
  pid_t pid_;
};

DeviceConfig Device(const std::string& name) {
  DeviceConfig device;
  device.name = name;
  return device;
}

TEST(InspectProcessTest, RunningDefunctAndGone) {
  const ProcessInfo self = InspectProcess(static_cast<uint32_t>(getpid()));
  EXPECT_EQ(self.state, ProcessState::kRunning);
  EXPECT_FALSE(self.name.empty());

  Zombie zombie;
  EXPECT_EQ(InspectProcess(zombie.pid()).state, ProcessState::kDefunct);

  const ProcessInfo gone = InspectProcess(ImpossiblePid());
  EXPECT_EQ(gone.state, ProcessState::kGone);
  EXPECT_EQ(gone.name, "");
}

TEST(InspectProcessTest, StateFollowsTheLastParenthesisOfTheName) {
  // A process may name itself "a) R (b"; the state is after the last ')'.
  const std::string root = absl::StrCat(::testing::TempDir(), "/proc-", getpid());
  mkdir(root.c_str(), 0700);
  mkdir((root + "/77").c_str(), 0700);
  std::ofstream(root + "/77/stat") << "77 (a) R (b) Z 1 77 77 0 -1\n";
  const ProcessInfo info = InspectProcess(77, root);
  EXPECT_EQ(info.state, ProcessState::kDefunct);
  // No comm file: the name comes from stat.
  EXPECT_EQ(info.name, "a) R (b");
}

TEST(GpuReporterTest, SplitsTheServerFromOtherProcessesWithTheirStates) {
  Zombie zombie;
  const uint32_t gone = ImpossiblePid();
  const uint32_t self = static_cast<uint32_t>(getpid());
  FakeGpuDriver fake;
  GpuMemorySample sample;
  sample.uuid = "GPU-fake-0";
  sample.name = "Fake GPU";
  sample.total_bytes = 80 * kGiB;
  sample.used_bytes = 20 * kGiB;
  sample.free_bytes = 60 * kGiB;
  sample.processes = {{gone, 7 * kGiB}, {self, 3 * kGiB},
                      {zombie.pid(), 9 * kGiB}};
  fake.Set("cpu:1", sample);

  GpuReporter::Options options;
  options.caching_allocator_bytes = [](const DeviceConfig&) {
    return uint64_t{512} << 20;
  };
  GpuReporter reporter(&fake, options);
  EXPECT_TRUE(reporter.Covers(Device("cpu:1")));
  EXPECT_FALSE(reporter.Covers(Device("cpu:0")));

  ASSERT_OK_AND_ASSIGN(DriverReport report, reporter.Report(Device("cpu:1")));
  EXPECT_EQ(report.uuid, "GPU-fake-0");
  EXPECT_EQ(report.name, "Fake GPU");
  EXPECT_EQ(report.total_bytes, 80 * kGiB);
  EXPECT_EQ(report.used_bytes, 20 * kGiB);
  EXPECT_EQ(report.free_bytes, 60 * kGiB);
  EXPECT_EQ(report.server_process_bytes, 3 * kGiB);
  EXPECT_EQ(report.caching_allocator_bytes, uint64_t{512} << 20);
  // Sorted by pid; the zombie's pid is lower than the impossible one.
  ASSERT_EQ(report.other_processes.size(), 2u);
  const GpuProcessReport& z = report.other_processes[0];
  EXPECT_EQ(z.pid, zombie.pid());
  EXPECT_EQ(z.state, ProcessState::kDefunct);
  EXPECT_EQ(z.used_bytes, 9 * kGiB);
  const GpuProcessReport& g = report.other_processes[1];
  EXPECT_EQ(g.pid, gone);
  EXPECT_EQ(g.state, ProcessState::kGone);
  EXPECT_EQ(g.used_bytes, 7 * kGiB);
  EXPECT_EQ(g.name, "");
}

TEST(GpuReporterTest, DriverErrorsPassThrough) {
  FakeGpuDriver fake;
  fake.Set("cpu:0", GpuMemorySample());
  fake.SetError(absl::UnavailableError("driver went away"));
  GpuReporter reporter(&fake, GpuReporter::Options());
  EXPECT_THAT(reporter.Report(Device("cpu:0")),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("driver went away")));
}

TEST(FakeGpuFileTest, ParsesGetStatsShapedJson) {
  ASSERT_OK_AND_ASSIGN(auto samples, ParseFakeGpuFile(R"({"devices": [
      {"device": "cpu:1", "driver": {"uuid": "GPU-x", "name": "X",
        "totalBytes": "85899345920", "usedBytes": 10, "freeBytes": "20",
        "processes": [{"pid": 12, "usedBytes": "30"}]}}]})"));
  ASSERT_EQ(samples.count("cpu:1"), 1u);
  const GpuMemorySample& s = samples.at("cpu:1");
  EXPECT_EQ(s.uuid, "GPU-x");
  EXPECT_EQ(s.total_bytes, 80 * kGiB);
  EXPECT_EQ(s.used_bytes, 10u);
  EXPECT_EQ(s.free_bytes, 20u);
  EXPECT_THAT(s.processes,
              ElementsAre(AllOf(Field(&GpuProcessUse::pid, 12u),
                                Field(&GpuProcessUse::used_bytes, 30u))));

  EXPECT_THAT(ParseFakeGpuFile(R"({"devices": [{"device": "cpu:1"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("needs \"device\" and \"driver\"")));
  EXPECT_THAT(ParseFakeGpuFile("{not json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fake GPU driver file")));
}

TEST(FakeGpuFileTest, FileIsReadAgainOnEverySample) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/fake-gpu-", getpid(), ".json");
  auto write = [&](uint64_t free_bytes) {
    std::ofstream(path) << absl::StrCat(
        R"({"devices": [{"device": "cpu:0", "driver": {"freeBytes": ")",
        free_bytes, R"("}}]})");
  };
  write(100);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakeGpuDriver> fake,
                       FakeGpuDriver::FromFile(path));
  ASSERT_OK_AND_ASSIGN(GpuMemorySample a, fake->Sample(Device("cpu:0"), false));
  EXPECT_EQ(a.free_bytes, 100u);
  write(200);
  ASSERT_OK_AND_ASSIGN(GpuMemorySample b, fake->Sample(Device("cpu:0"), false));
  EXPECT_EQ(b.free_bytes, 200u);
  EXPECT_FALSE(fake->Covers(Device("cpu:1")));
}

}  // namespace
}  // namespace materializer::memory
