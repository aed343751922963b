#include "server/metrics/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "materializer/v1/materializer.pb.h"
#include "server/memory/fake_gpu_driver.h"
#include "server/memory/gpu_report.h"
#include "server/memory/pool.h"
#include "server/registry/registry.h"
#include "tests/testing/status_matchers.h"

namespace materializer::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// "name{labels}" -> value, from the text format.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == std::string::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      ADD_FAILURE() << "unparseable line: " << line;
      continue;
    }
    samples[line.substr(0, space)] = value;
  }
  return samples;
}

double Sample(const std::map<std::string, double>& samples,
              const std::string& key) {
  auto it = samples.find(key);
  if (it == samples.end()) {
    ADD_FAILURE() << "no sample " << key;
    return -1;
  }
  return it->second;
}

TEST(MetricsTest, RpcsCountByMethodAndCodeWithLatencyHistograms) {
  Metrics metrics;
  metrics.RecordRpc("Plan", absl::StatusCode::kOk, absl::Milliseconds(2));
  metrics.RecordRpc("Plan", absl::StatusCode::kOk, absl::Milliseconds(40));
  metrics.RecordRpc("Plan", absl::StatusCode::kInvalidArgument,
                    absl::Microseconds(300));
  metrics.RecordRpc("Release", absl::StatusCode::kNotFound,
                    absl::Microseconds(50));
  const auto s = Samples(metrics.TextFormat());
  EXPECT_EQ(Sample(s, R"(materializer_rpcs_total{code="OK",method="Plan"})"), 2);
  EXPECT_EQ(Sample(s, R"(materializer_rpcs_total{code="INVALID_ARGUMENT",method="Plan"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_rpcs_total{code="NOT_FOUND",method="Release"})"), 1);
  // Codes never seen make no series.
  EXPECT_EQ(s.count(R"(materializer_rpcs_total{code="NOT_FOUND",method="Plan"})"), 0u);
  EXPECT_EQ(Sample(s, R"(materializer_rpc_duration_seconds_count{method="Plan"})"), 3);
  EXPECT_NEAR(Sample(s, R"(materializer_rpc_duration_seconds_sum{method="Plan"})"),
              0.0423, 1e-9);
  EXPECT_EQ(Sample(s, R"(materializer_rpc_duration_seconds_bucket{method="Plan",le="0.0025"})"), 2);
  EXPECT_EQ(Sample(s, R"(materializer_rpc_duration_seconds_bucket{method="Plan",le="0.05"})"), 3);
}

TEST(MetricsTest, MaterializePhasesAndInitThroughputByRngMode) {
  Metrics metrics;
  v1::PhaseTimings t;
  t.set_validate_us(100);
  t.set_plan_us(200);
  t.set_reserve_us(10);
  t.set_allocate_us(1000);
  t.set_init_us(500000);  // 0.5 s
  t.set_register_us(5);
  t.set_total_us(501315);
  metrics.RecordMaterialize(t, "portable", 1000000000);  // 1 GB in 0.5 s
  metrics.RecordMaterialize(t, "torch", 250000000);
  const auto s = Samples(metrics.TextFormat());
  EXPECT_EQ(Sample(s, R"(materializer_materialize_phase_seconds_count{phase="init"})"), 2);
  EXPECT_NEAR(Sample(s, R"(materializer_materialize_phase_seconds_sum{phase="allocate"})"),
              0.002, 1e-12);
  EXPECT_NEAR(Sample(s, R"(materializer_materialize_phase_seconds_sum{phase="total"})"),
              1.00263, 1e-9);
  EXPECT_EQ(Sample(s, R"(materializer_init_bytes_total{rng="portable"})"), 1e9);
  EXPECT_EQ(Sample(s, R"(materializer_init_seconds_total{rng="torch"})"), 0.5);
  // 2 GB/s lands in the (1e9, 3e9] bucket; 0.5 GB/s in (3e8, 1e9].
  EXPECT_EQ(Sample(s, R"(materializer_init_bytes_per_second_bucket{rng="portable",le="1000000000"})"), 0);
  EXPECT_EQ(Sample(s, R"(materializer_init_bytes_per_second_bucket{rng="portable",le="3000000000"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_init_bytes_per_second_bucket{rng="torch",le="1000000000"})"), 1);
}

TEST(MetricsTest, FetchesExportsSessionsAndCleanup) {
  Metrics metrics;
  metrics.RecordFetchStart(false);
  metrics.RecordFetchStart(true);
  metrics.RecordFetchStart(false);
  metrics.AddFetchBytes(4000);
  metrics.AddFetchBytes(96);
  metrics.RecordExportOpened("shared_memory");
  metrics.RecordExportClosed();
  metrics.RecordSessionOpened(false);
  metrics.RecordSessionOpened(false);
  metrics.RecordSessionOpened(true);
  metrics.RecordSessionEnded(absl::Milliseconds(3), absl::Seconds(5), 4);
  metrics.RecordLeaseExpiry(absl::Milliseconds(1), 2);
  const auto s = Samples(metrics.TextFormat());
  EXPECT_EQ(Sample(s, R"(materializer_fetches_total{kind="start"})"), 2);
  EXPECT_EQ(Sample(s, R"(materializer_fetches_total{kind="resume"})"), 1);
  EXPECT_EQ(Sample(s, "materializer_fetch_bytes_total"), 4096);
  EXPECT_EQ(Sample(s, R"(materializer_exports_opened_total{kind="shared_memory"})"), 1);
  EXPECT_EQ(Sample(s, "materializer_exports_closed_total"), 1);
  EXPECT_EQ(Sample(s, "materializer_sessions_opened_total"), 2);
  EXPECT_EQ(Sample(s, "materializer_sessions_resumed_total"), 1);
  EXPECT_EQ(Sample(s, "materializer_sessions_expired_total"), 1);
  EXPECT_EQ(Sample(s, "materializer_sessions"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_cleanup_handles_total{reason="session_end"})"), 4);
  EXPECT_EQ(Sample(s, R"(materializer_cleanup_handles_total{reason="lease_expiry"})"), 2);
  EXPECT_EQ(Sample(s, R"(materializer_cleanup_seconds_count{reason="session_end"})"), 1);
  EXPECT_EQ(Sample(s, "materializer_session_release_delay_seconds_sum"), 5);
}

// A zombie child (exited, not reaped) while alive.
class Zombie {
 public:
  Zombie() {
    pid_ = fork();
    if (pid_ == 0) _exit(0);
    siginfo_t info{};
    waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT);
  }
  ~Zombie() { waitpid(pid_, nullptr, 0); }
  uint32_t pid() const { return static_cast<uint32_t>(pid_); }

 private:
  pid_t pid_;
};

TEST(MetricsTest, StateComesFromTheLedgerRegistryAndDriverAtScrapeTime) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  memory::FakeGpuDriver driver;
  Zombie zombie;
  memory::GpuMemorySample gpu;
  gpu.uuid = "GPU-fake-1";
  gpu.name = "Fake GPU";
  gpu.total_bytes = 8000 * kMiB;
  gpu.used_bytes = 3000 * kMiB;
  gpu.free_bytes = 5000 * kMiB;
  gpu.processes = {{static_cast<uint32_t>(getpid()), 100 * kMiB},
                   {zombie.pid(), 700 * kMiB},
                   {4000000000u, 200 * kMiB}};  // no such pid
  driver.Set("cpu:1", gpu);
  memory::GpuReporter reporter(&driver, memory::GpuReporter::Options());

  std::vector<memory::DeviceConfig> devices(2);
  for (int i = 0; i < 2; ++i) {
    devices[i].name = absl::StrCat("cpu:", i);
    devices[i].ordinal = i;
    devices[i].capacity_bytes = 1000 * kMiB;
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<memory::DevicePool> pool,
                       memory::DevicePool::Create(devices));
  registry::HandleRegistry handles;
  StateSources sources;
  sources.pool = pool.get();
  sources.registry = &handles;
  sources.gpu = &reporter;
  sources.client_labels = 2;
  Metrics metrics(sources);

  ASSERT_OK_AND_ASSIGN(memory::Reservation a,
                       pool->Reserve("alice", "cpu:0", 300 * kMiB));
  memory::Allocation a_in_use = std::move(a).Commit();
  ASSERT_OK_AND_ASSIGN(memory::Reservation b,
                       pool->Reserve("bob", "cpu:1", 200 * kMiB));
  ASSERT_OK_AND_ASSIGN(memory::Reservation c,
                       pool->Reserve("carol", "cpu:1", 10 * kMiB));
  ASSERT_OK_AND_ASSIGN(memory::Reservation d,
                       pool->Reserve("dave", "cpu:0", 20 * kMiB));
  registry::HandleSpec spec;
  spec.owner = "alice";
  std::shared_ptr<registry::Handle> h1 = handles.Create(spec);
  std::shared_ptr<registry::Handle> h2 = handles.Create(spec);
  h2->MarkFailed("boom");

  const std::string text = metrics.TextFormat();
  const auto s = Samples(text);
  EXPECT_EQ(Sample(s, R"(materializer_device_capacity_bytes{device="cpu:0"})"), 1000 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_device_in_use_bytes{device="cpu:0"})"), 300 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_device_reserved_bytes{device="cpu:0"})"), 20 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_device_reserved_bytes{device="cpu:1"})"), 210 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_device_peak_bytes{device="cpu:1"})"), 210 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_device_handles{device="cpu:0"})"), 2);
  // Two named clients (the most bytes), the other two summed.
  EXPECT_EQ(Sample(s, "materializer_clients"), 4);
  EXPECT_EQ(Sample(s, R"(materializer_client_in_use_bytes{client="alice"})"), 300 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_client_reserved_bytes{client="bob"})"), 200 * kMiB);
  EXPECT_EQ(Sample(s, R"x(materializer_client_reserved_bytes{client="(other)"})x"), 30 * kMiB);
  EXPECT_EQ(Sample(s, R"x(materializer_client_handles{client="(other)"})x"), 2);
  EXPECT_THAT(text, Not(HasSubstr("client=\"carol\"")));
  // Handles by state.
  EXPECT_EQ(Sample(s, R"(materializer_handles{state="materializing"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_handles{state="failed"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_handles{state="ready"})"), 0);
  EXPECT_EQ(Sample(s, "materializer_exports_open"), 0);
  // The driver's view of cpu:1 (and nothing for cpu:0, which it does not
  // cover).
  EXPECT_EQ(Sample(s, R"(materializer_gpu_info{device="cpu:1",uuid="GPU-fake-1",name="Fake GPU"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_driver_up{device="cpu:1"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_free_bytes{device="cpu:1"})"), 5000 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_used_bytes{device="cpu:1"})"), 3000 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_server_process_bytes{device="cpu:1"})"), 100 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_other_processes{device="cpu:1",state="defunct"})"), 1);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_other_process_bytes{device="cpu:1",state="defunct"})"), 700 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_other_process_bytes{device="cpu:1",state="gone"})"), 200 * kMiB);
  EXPECT_EQ(Sample(s, R"(materializer_gpu_other_processes{device="cpu:1",state="running"})"), 0);
  EXPECT_THAT(text, Not(HasSubstr("materializer_gpu_free_bytes{device=\"cpu:0\"}")));

  // A driver that stops answering shows as down, not as stale figures.
  driver.SetError(absl::UnavailableError("gone"));
  const auto after = Samples(metrics.TextFormat());
  EXPECT_EQ(Sample(after, R"(materializer_gpu_driver_up{device="cpu:1"})"), 0);
  EXPECT_EQ(after.count(R"(materializer_gpu_free_bytes{device="cpu:1"})"), 0u);
}

TEST(MetricsTest, RecordingAndScrapingConcurrently) {
  Metrics metrics;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < 2000; ++i) {
        metrics.RecordRpc(t % 2 == 0 ? "Plan" : "Describe",
                          i % 3 == 0 ? absl::StatusCode::kNotFound
                                     : absl::StatusCode::kOk,
                          absl::Microseconds(i));
        metrics.AddFetchBytes(1);
      }
    });
  }
  for (int i = 0; i < 20; ++i) metrics.TextFormat();
  for (std::thread& thread : threads) thread.join();
  const auto s = Samples(metrics.TextFormat());
  EXPECT_EQ(Sample(s, R"(materializer_rpc_duration_seconds_count{method="Plan"})"), 4000);
  EXPECT_EQ(Sample(s, R"(materializer_rpcs_total{code="NOT_FOUND",method="Describe"})") +
                Sample(s, R"(materializer_rpcs_total{code="OK",method="Describe"})"),
            4000);
  EXPECT_EQ(Sample(s, "materializer_fetch_bytes_total"), 8000);
}

}  // namespace
}  // namespace materializer::metrics
