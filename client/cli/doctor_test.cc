#include "client/cli/doctor.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::client::cli {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;

v1::GetStatsResponse GpuServer() {
  v1::GetStatsResponse stats;
  v1::DeviceStats* gpu = stats.add_devices();
  gpu->set_device("cuda:0");
  gpu->set_capacity_bytes(79 * kGiB);
  gpu->set_in_use_bytes(8 * kGiB);
  gpu->set_handles(3);
  v1::DriverMemory* driver = gpu->mutable_driver();
  driver->set_uuid("GPU-1234");
  driver->set_name("NVIDIA H100 80GB HBM3");
  driver->set_total_bytes(80 * kGiB);
  driver->set_used_bytes(14 * kGiB);
  driver->set_free_bytes(66 * kGiB);
  driver->set_server_process_bytes(10 * kGiB);
  driver->set_caching_allocator_bytes(8 * kGiB);
  auto add = [driver](uint32_t pid, const char* name, uint64_t bytes,
                      const char* state) {
    v1::GpuProcess* process = driver->add_processes();
    process->set_pid(pid);
    process->set_name(name);
    process->set_used_bytes(bytes);
    process->set_state(state);
  };
  add(4242, "python3", 2 * kGiB, "running");
  add(17, "trainer", kGiB, "defunct");
  add(99, "", kGiB, "gone");
  // NVML could not be read for this one.
  stats.add_devices()->set_device("cuda:1");
  return stats;
}

v1::GetStatsResponse CpuServer() {
  v1::GetStatsResponse stats;
  v1::DeviceStats* cpu = stats.add_devices();
  cpu->set_device("cpu");
  cpu->set_capacity_bytes(8 * kGiB);
  cpu->set_in_use_bytes(1 << 20);
  cpu->set_handles(1);
  return stats;
}

std::vector<FromReplica<v1::GetStatsResponse>> Fleet() {
  std::vector<FromReplica<v1::GetStatsResponse>> fleet(3);
  fleet[0] = {"r0", "10.0.0.1:50051", GpuServer()};
  fleet[1] = {"r1", "10.0.0.2:50051", CpuServer()};
  fleet[2] = {"r2", "10.0.0.3:50051",
              absl::UnavailableError("connection refused")};
  return fleet;
}

TEST(RenderDoctorTest, ShowsDriverServerLedgerAndProcessesPerGpu) {
  const std::string text = RenderDoctor(Fleet());
  EXPECT_THAT(text, HasSubstr("replica r0 (10.0.0.1:50051)\n"
                              "  cuda:0  NVIDIA H100 80GB HBM3  GPU-1234\n"));
  EXPECT_THAT(text, HasSubstr("driver       80.00 GiB total, 14.00 GiB used, "
                              "66.00 GiB free"));
  EXPECT_THAT(text, HasSubstr("this server  10.00 GiB as the driver counts "
                              "it; LibTorch's caching allocator holds "
                              "8.00 GiB"));
  EXPECT_THAT(text, HasSubstr("ledger       79.00 GiB capacity, 0 B "
                              "reserved, 8.00 GiB in use, 3 handles"));
  EXPECT_THAT(text, HasSubstr("4242  python3  2.00 GiB  running"));
  EXPECT_THAT(text, HasSubstr("17  trainer  1.00 GiB  DEFUNCT (zombie)"));
  EXPECT_THAT(text,
              HasSubstr("99  -        1.00 GiB  GONE (not visible here)"));
  EXPECT_THAT(text, HasSubstr("  cuda:1\n    driver  figures unavailable"));
}

TEST(RenderDoctorTest, AServerWithoutAGpuSaysSo) {
  const std::string text = RenderDoctor(Fleet());
  EXPECT_THAT(text,
              HasSubstr("replica r1 (10.0.0.2:50051)\n"
                        "  no GPU on this server; its devices: cpu (ledger: "
                        "8.00 GiB capacity, 0 B reserved, 1.00 MiB in use, "
                        "1 handle)\n"));
  EXPECT_THAT(text, HasSubstr("replica r2 (10.0.0.3:50051)\n"
                              "  did not answer: connection refused\n"));
}

TEST(DoctorFindingsTest, FlagsDefunctAndGoneProcessesAndSilentReplicas) {
  EXPECT_THAT(
      DoctorFindings(Fleet()),
      ElementsAre(
          AllOf(HasSubstr("replica r0 (10.0.0.1:50051): cuda:0: process 17 "
                          "(trainer) is defunct and still holds 1.00 GiB"),
                HasSubstr("parent reaps it")),
          HasSubstr("cuda:0: process 99 is not visible to the server but the "
                    "driver counts 1.00 GiB"),
          HasSubstr("replica r2 (10.0.0.3:50051) did not answer")));
}

TEST(DoctorFindingsTest, MemoryHeldOutsideWithoutAListIsReported) {
  std::vector<FromReplica<v1::GetStatsResponse>> one(1);
  v1::GetStatsResponse stats = GpuServer();
  stats.mutable_devices(0)->mutable_driver()->clear_processes();
  one[0] = {"", "127.0.0.1:50051", stats};
  EXPECT_THAT(DoctorFindings(one),
              ElementsAre(HasSubstr("the server at 127.0.0.1:50051: cuda:0: "
                                    "4.00 GiB is held outside this server")));
  EXPECT_THAT(RenderDoctor(one),
              HasSubstr("other processes: none listed, but 4.00 GiB"));

  // Nothing outside: no finding.
  stats.mutable_devices(0)->mutable_driver()->set_used_bytes(10 * kGiB);
  one[0].result = stats;
  EXPECT_THAT(DoctorFindings(one), ::testing::IsEmpty());
  EXPECT_THAT(RenderDoctor(one), AllOf(HasSubstr("other processes: none\n"),
                                       HasSubstr("findings: none")));
}

TEST(DoctorJsonTest, KeepsTheStatsAndTheFindings) {
  const std::string json = DoctorJson(Fleet()).Render();
  EXPECT_THAT(json, HasSubstr("\"replica\":\"r0\""));
  EXPECT_THAT(json, HasSubstr("\"serverProcessBytes\":\"10737418240\""));
  EXPECT_THAT(json, HasSubstr("\"state\":\"defunct\""));
  EXPECT_THAT(json, HasSubstr("\"error\":{\"code\":\"UNAVAILABLE\""));
  EXPECT_THAT(json, HasSubstr("\"findings\":[\"replica r0"));
  EXPECT_THAT(json, Not(HasSubstr("\"pid\":\"17\"")));  // uint32: a number
  EXPECT_THAT(json, HasSubstr("\"pid\":17"));
}

}  // namespace
}  // namespace materializer::client::cli
