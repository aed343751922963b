// What the engine reports for monitoring: the GPU driver's view in
// GetStats (processes for admins only), and materializations and exports
// in the metrics.

#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "google/protobuf/text_format.h"
#include "server/engine/engine.h"
#include "server/memory/fake_gpu_driver.h"
#include "server/memory/gpu_report.h"
#include "server/metrics/metrics.h"
#include "tests/testing/status_matchers.h"

namespace materializer::engine {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

v1::MaterializeRequest Request(bool async) {
  v1::MaterializeRequest request;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"pb(
    model {
      tensors { name: "w" shape: [ 256, 256 ] dtype: "float32" }
      init_rules { pattern: "*" init { normal { std: 0.02 } } }
      seed: 1
    }
    placement { device: "cpu:0" }
  )pb", &request));
  request.set_async(async);
  return request;
}

class EngineObserveTest : public ::testing::Test {
 protected:
  EngineObserveTest() {
    std::vector<memory::DeviceConfig> devices(2);
    for (int i = 0; i < 2; ++i) {
      devices[i].name = "cpu:" + std::to_string(i);
      devices[i].ordinal = i;
      devices[i].capacity_bytes = 64 * kMiB;
    }
    memory::GpuMemorySample gpu;
    gpu.uuid = "GPU-fake-1";
    gpu.name = "Fake GPU";
    gpu.total_bytes = 100 * kMiB;
    gpu.used_bytes = 60 * kMiB;
    gpu.free_bytes = 40 * kMiB;
    gpu.processes = {{static_cast<uint32_t>(getpid()), 5 * kMiB},
                     {4000000000u, 50 * kMiB}};
    driver_.Set("cpu:1", gpu);
    pool_ = memory::DevicePool::Create(devices).value();
    workers_ = std::make_unique<ThreadPool>(1);
    EngineOptions options;
    options.metrics = &metrics_;
    options.gpu = &reporter_;
    engine_ = std::make_unique<Engine>(pool_.get(), &registry_,
                                       workers_.get(), options);
  }
  ~EngineObserveTest() override { workers_.reset(); }

  memory::FakeGpuDriver driver_;
  memory::GpuReporter reporter_{&driver_, memory::GpuReporter::Options()};
  metrics::Metrics metrics_;
  std::unique_ptr<memory::DevicePool> pool_;
  registry::HandleRegistry registry_;
  std::unique_ptr<ThreadPool> workers_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineObserveTest, GetStatsShowsTheDriverAndProcessesOnlyToAdmins) {
  const v1::GetStatsResponse user = engine_->GetStats({"alice", "", false});
  ASSERT_EQ(user.devices_size(), 2);
  EXPECT_FALSE(user.devices(0).has_driver());  // not covered
  const v1::DriverMemory& d = user.devices(1).driver();
  EXPECT_EQ(d.uuid(), "GPU-fake-1");
  EXPECT_EQ(d.name(), "Fake GPU");
  EXPECT_EQ(d.total_bytes(), 100 * kMiB);
  EXPECT_EQ(d.used_bytes(), 60 * kMiB);
  EXPECT_EQ(d.free_bytes(), 40 * kMiB);
  EXPECT_EQ(d.server_process_bytes(), 5 * kMiB);
  EXPECT_EQ(d.processes_size(), 0);  // other processes: admins only

  const v1::GetStatsResponse admin = engine_->GetStats({"ops", "", true});
  const v1::DriverMemory& a = admin.devices(1).driver();
  ASSERT_EQ(a.processes_size(), 1);
  EXPECT_EQ(a.processes(0).pid(), 4000000000u);
  EXPECT_EQ(a.processes(0).state(), "gone");
  EXPECT_EQ(a.processes(0).used_bytes(), 50 * kMiB);

  // A driver that stops answering leaves the field unset.
  driver_.SetError(absl::UnavailableError("nvml gone"));
  EXPECT_FALSE(engine_->GetStats({"ops", "", true}).devices(1).has_driver());
}

TEST_F(EngineObserveTest, SyncAndAsyncMaterializationsAreCounted) {
  const Caller alice{"alice", "", false};
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse sync,
                       engine_->Materialize(alice, Request(false)));
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse async,
                       engine_->Materialize(alice, Request(true)));
  // Wait for the async one to finish.
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<v1::HandleInfo> info =
        engine_->Describe(alice, [&] {
          v1::DescribeRequest r;
          r.set_handle(async.handle());
          return r;
        }());
    ASSERT_OK(info.status());
    if (info->state() == v1::HANDLE_STATE_READY) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  workers_.reset();  // the async build has recorded by now
  const std::string text = metrics_.TextFormat();
  EXPECT_THAT(text, HasSubstr(
      "materializer_materialize_phase_seconds_count{phase=\"init\"} 2\n"));
  EXPECT_THAT(text, HasSubstr(
      "materializer_init_bytes_total{rng=\"portable\"} 524288\n"));
}

}  // namespace
}  // namespace materializer::engine
