#include "server/memory/pool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "server/memory/fake_gpu_driver.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<DevicePool> MakePool(std::vector<uint64_t> capacities) {
  std::vector<DeviceConfig> devices;
  for (size_t i = 0; i < capacities.size(); ++i) {
    DeviceConfig device;
    device.name = i == 0 ? "cpu" : "cuda:" + std::to_string(i - 1);
    device.kind = i == 0 ? DeviceKind::kCpu : DeviceKind::kCuda;
    device.ordinal = i == 0 ? 0 : static_cast<int>(i - 1);
    device.capacity_bytes = capacities[i];
    devices.push_back(device);
  }
  return DevicePool::Create(devices).value();
}

void ExpectAllZero(const DevicePool& pool) {
  const PoolSnapshot snapshot = pool.Snapshot();
  for (const DeviceUsage& d : snapshot.devices) {
    EXPECT_EQ(d.usage.reserved_bytes, 0u) << d.device.name;
    EXPECT_EQ(d.usage.in_use_bytes, 0u) << d.device.name;
    EXPECT_EQ(d.usage.handles, 0u) << d.device.name;
  }
  EXPECT_TRUE(snapshot.clients.empty());
  EXPECT_EQ(snapshot.total.reserved_bytes, 0u);
  EXPECT_EQ(snapshot.total.in_use_bytes, 0u);
  EXPECT_EQ(snapshot.total.handles, 0u);
}

TEST(DevicePoolTest, ReserveCommitFreeMovesBytesThroughTheLedger) {
  auto pool = MakePool({1000});
  {
    ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 300));
    PoolSnapshot s = pool->Snapshot();
    EXPECT_EQ(s.devices[0].usage.reserved_bytes, 300u);
    EXPECT_EQ(s.devices[0].usage.in_use_bytes, 0u);
    EXPECT_EQ(s.clients.at("alice").total.reserved_bytes, 300u);
    EXPECT_EQ(pool->FreeBytes(0), 700u);

    Allocation a = std::move(r).Commit();
    s = pool->Snapshot();
    EXPECT_EQ(s.devices[0].usage.reserved_bytes, 0u);
    EXPECT_EQ(s.devices[0].usage.in_use_bytes, 300u);
    EXPECT_EQ(s.devices[0].usage.handles, 1u);
    EXPECT_EQ(s.clients.at("alice").total.in_use_bytes, 300u);
    EXPECT_EQ(s.total.in_use_bytes, 300u);
    EXPECT_EQ(pool->FreeBytes(0), 700u);
  }
  ExpectAllZero(*pool);
  EXPECT_EQ(pool->Snapshot().devices[0].usage.peak_bytes, 300u);
}

TEST(DevicePoolTest, DroppedReservationRollsBack) {
  auto pool = MakePool({1000});
  { ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("bob", "auto", 999)); }
  ExpectAllZero(*pool);
}

TEST(DevicePoolTest, FullDeviceIsResourceExhaustedWithFiguresAndNoChange) {
  auto pool = MakePool({1000});
  ASSERT_OK_AND_ASSIGN(Reservation held, pool->Reserve("alice", "cpu", 600));
  EXPECT_THAT(pool->Reserve("bob", "cpu", 500).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("needs 500 B (500 bytes)"),
                             HasSubstr("only 400 B (400 bytes)"),
                             HasSubstr("1000 B (1000 bytes)"))));
  PoolSnapshot s = pool->Snapshot();
  EXPECT_EQ(s.devices[0].usage.reserved_bytes, 600u);
  EXPECT_EQ(s.clients.count("bob"), 0u);
}

TEST(DevicePoolTest, UnknownDeviceListsTheRealOnes) {
  auto pool = MakePool({1000, 2000});
  EXPECT_THAT(pool->Reserve("alice", "cuda:7", 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"cuda:7\" is not a device"),
                             HasSubstr("auto, cpu, cuda:0"))));
  ExpectAllZero(*pool);
}

TEST(DevicePoolTest, AutoPicksTheTightestFitThenPoolOrder) {
  auto pool = MakePool({1000, 500, 500});
  // 400 fits everywhere; cuda:0 and cuda:1 tie with the least free bytes.
  EXPECT_EQ(pool->Resolve("alice", "auto", 400).value(), 1);
  ASSERT_OK_AND_ASSIGN(Reservation a, pool->Reserve("alice", "auto", 400));
  EXPECT_EQ(a.device_index(), 1);
  // Now cuda:0 has 100 free: 200 goes to the next tightest, cuda:1.
  ASSERT_OK_AND_ASSIGN(Reservation b, pool->Reserve("alice", "", 200));
  EXPECT_EQ(b.device_index(), 2);
  // 900 only fits the CPU.
  ASSERT_OK_AND_ASSIGN(Reservation c, pool->Reserve("alice", "auto", 900));
  EXPECT_EQ(c.device_index(), 0);
  // Nothing has 400 left anywhere.
  EXPECT_THAT(pool->Reserve("alice", "auto", 400).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("no device can take")));
}

TEST(DevicePoolTest, ZeroByteReservationsCountAsHandles) {
  auto pool = MakePool({0});
  ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 0));
  Allocation a = std::move(r).Commit();
  EXPECT_EQ(pool->Snapshot().devices[0].usage.handles, 1u);
}

TEST(DevicePoolTest, ConcurrentClientsNeverOvercommitAndEndAtZero) {
  auto pool = MakePool({10000});
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const std::string client = "client" + std::to_string(t % 3);
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<Reservation> r = pool->Reserve(client, "auto", 700);
        if (!r.ok()) continue;
        admitted.fetch_add(1);
        const PoolSnapshot s = pool->Snapshot();
        EXPECT_LE(s.devices[0].usage.reserved_bytes +
                      s.devices[0].usage.in_use_bytes,
                  10000u);
        if (i % 2 == 0) Allocation a = std::move(*r).Commit();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_GT(admitted.load(), 0);
  ExpectAllZero(*pool);
  EXPECT_LE(pool->Snapshot().devices[0].usage.peak_bytes, 10000u);
}

std::unique_ptr<DevicePool> PoolWithQuotas(const char* json) {
  std::vector<DeviceConfig> devices;
  for (int i = 0; i < 2; ++i) {
    DeviceConfig device;
    device.name = "cpu:" + std::to_string(i);
    device.ordinal = i;
    device.capacity_bytes = 1000;
    devices.push_back(device);
  }
  return DevicePool::Create(devices, QuotaBook::FromJson(json).value())
      .value();
}

TEST(DevicePoolQuotaTest, TotalQuotaIsEnforcedWithFiguresAndNoChange) {
  auto pool = PoolWithQuotas(R"({"clients": {"alice": {"totalBytes": 500}}})");
  ASSERT_OK_AND_ASSIGN(Reservation a, pool->Reserve("alice", "cpu:0", 300));
  EXPECT_THAT(pool->Reserve("alice", "cpu:1", 300).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("needs 300 B (300 bytes)"),
                             HasSubstr("already holds 300 B (300 bytes)"),
                             HasSubstr("500 B (500 bytes) total quota"))));
  EXPECT_EQ(pool->Snapshot().clients.at("alice").total.reserved_bytes, 300u);
  EXPECT_EQ(pool->AvailableTo("alice", 1), 200u);
  // Bob has no quota: the devices' free bytes are the limit.
  EXPECT_EQ(pool->AvailableTo("bob", 1), 1000u);
  ASSERT_OK_AND_ASSIGN(Reservation b, pool->Reserve("bob", "cpu:1", 900));
}

TEST(DevicePoolQuotaTest, PerDeviceAndHandleQuotas) {
  auto pool = PoolWithQuotas(R"({
    "default": {"handles": 2, "deviceBytes": "600"},
    "clients": {"carol": {"devices": {"cpu:1": 100}}}})");
  ASSERT_OK_AND_ASSIGN(Reservation a, pool->Reserve("dave", "cpu:0", 600));
  EXPECT_THAT(pool->Reserve("dave", "cpu:0", 1).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("600 B (600 bytes) quota on cpu:0")));
  ASSERT_OK_AND_ASSIGN(Reservation b, pool->Reserve("dave", "cpu:1", 10));
  EXPECT_THAT(pool->Reserve("dave", "cpu:1", 10).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("holds 2 handles; its quota is 2")));
  // carol: the default's handle limit, her own cap on cpu:1; auto goes to
  // the device her quota admits.
  ASSERT_OK_AND_ASSIGN(Reservation c, pool->Reserve("carol", "auto", 200));
  EXPECT_EQ(c.device_index(), 0);
  EXPECT_THAT(pool->Reserve("carol", "cpu:1", 200).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("100 B (100 bytes) quota on cpu:1")));
}

std::unique_ptr<DevicePool> FourCpus(std::vector<uint64_t> capacities,
                                     const char* quotas = "{}") {
  std::vector<DeviceConfig> devices;
  for (size_t i = 0; i < capacities.size(); ++i) {
    DeviceConfig device;
    device.name = "cpu:" + std::to_string(i);
    device.ordinal = static_cast<int>(i);
    device.capacity_bytes = capacities[i];
    devices.push_back(device);
  }
  return DevicePool::Create(devices, QuotaBook::FromJson(quotas).value())
      .value();
}

TEST(DevicePoolSplitTest, UnitsFillDevicesInOrderWithinCaps) {
  auto pool = FourCpus({1000, 2000, 3000, 4000});
  DevicePool::SplitRequest request;
  request.unit_bytes = {600, 600, 600, 600, 600, 2500};
  request.max_memory = {{"cpu:1", 1200}};
  ASSERT_OK_AND_ASSIGN(DevicePool::SplitReservation split,
                       pool->ReserveSplit("alice", request));
  // cpu:0 takes one unit (1000), cpu:1 two (capped at 1200), cpu:2 two
  // more; 2500 no longer fits cpu:2 (1800 left) and goes to cpu:3.
  EXPECT_THAT(split.plan.part_devices, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(split.plan.part_of_unit, ElementsAre(0, 1, 1, 2, 2, 3));
  EXPECT_THAT(split.plan.part_bytes, ElementsAre(600, 1200, 1200, 2500));
  const PoolSnapshot s = pool->Snapshot();
  EXPECT_EQ(s.devices[1].usage.reserved_bytes, 1200u);
  EXPECT_EQ(s.devices[3].usage.reserved_bytes, 2500u);
  EXPECT_EQ(s.clients.at("alice").total.reserved_bytes, 5500u);
}

TEST(DevicePoolSplitTest, AUnitThatFitsNowhereChangesNothing) {
  auto pool = FourCpus({1000, 1000});
  DevicePool::SplitRequest request;
  request.unit_bytes = {900, 1500};
  request.unit_names = {"layers.0", "layers.1"};
  EXPECT_THAT(pool->ReserveSplit("alice", request).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("\"layers.1\" needs 1.46 KiB"),
                             HasSubstr("fits on no remaining device"))));
  ExpectAllZero(*pool);
  request.devices = {"cpu:9"};
  EXPECT_THAT(pool->ReserveSplit("alice", request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("placement.split.devices")));
  request.devices = {};
  request.max_memory = {{"cuda:0", 5}};
  EXPECT_THAT(pool->ReserveSplit("alice", request).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("placement.split.max_memory")));
}

TEST(DevicePoolSplitTest, TheClientsTotalQuotaHoldsAcrossDevices) {
  auto pool = FourCpus({1000, 1000},
                       R"({"clients": {"alice": {"totalBytes": 1500}}})");
  DevicePool::SplitRequest request;
  request.unit_bytes = {900, 900};
  EXPECT_THAT(pool->ReserveSplit("alice", request).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("total quota")));
  ExpectAllZero(*pool);
}

// A file an "importer" holds with a shared flock, as the SDK holds an
// export it maps; the pool gets its own descriptor of the same file.
struct ImportedFile {
  ImportedFile() {
    char path[] = "/tmp/pool-handover-XXXXXX";
    importer_fd = mkstemp(path);
    name = path;
    server_fd = open(path, O_RDWR | O_CLOEXEC);
    flock(importer_fd, LOCK_SH);
  }
  ~ImportedFile() {
    if (importer_fd >= 0) close(importer_fd);
    unlink(name.c_str());
  }
  void LetGo() {
    close(importer_fd);
    importer_fd = -1;
  }
  std::string name;
  int importer_fd = -1;
  int server_fd = -1;
};

TEST(DevicePoolHandOverTest, BytesStayCountedUntilTheImporterLetsGo) {
  auto pool = MakePool({1000});
  ImportedFile file;
  ASSERT_GE(file.server_fd, 0);
  {
    ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 600));
    std::move(r).Commit().HandOver({file.server_fd});
  }
  PoolSnapshot s = pool->Snapshot();
  EXPECT_EQ(s.devices[0].usage.in_use_bytes, 0u);
  EXPECT_EQ(s.devices[0].usage.handles, 0u);
  EXPECT_EQ(s.devices[0].usage.handed_over_bytes, 600u);
  EXPECT_EQ(s.clients.at("alice").total.handed_over_bytes, 600u);
  EXPECT_EQ(s.total.handed_over_bytes, 600u);
  EXPECT_EQ(pool->FreeBytes(0), 400u);
  // Counted against the capacity, with the reason in the refusal.
  EXPECT_THAT(pool->Reserve("bob", "cpu", 500).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("of released handles are still mapped")));
  pool->SweepHandedOver();
  EXPECT_EQ(pool->Snapshot().total.handed_over_bytes, 600u);

  file.LetGo();
  // Reserve sweeps before it decides: no wait for the watcher.
  ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("bob", "cpu", 500));
  s = pool->Snapshot();
  EXPECT_EQ(s.total.handed_over_bytes, 0u);
  EXPECT_EQ(s.clients.count("alice"), 0u);
  // The pool closed its descriptor.
  EXPECT_EQ(fcntl(file.server_fd, F_GETFD), -1);
}

TEST(DevicePoolHandOverTest, TheWatcherFreesThemWithoutAnyCall) {
  auto pool = MakePool({1000});
  ImportedFile file;
  {
    ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu", 100));
    std::move(r).Commit().HandOver({file.server_fd});
  }
  file.LetGo();
  for (int i = 0; i < 100 && pool->Snapshot().total.handed_over_bytes > 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ExpectAllZero(*pool);
  EXPECT_EQ(pool->Snapshot().total.handed_over_bytes, 0u);
}

TEST(DevicePoolHandOverTest, TheClientsQuotaCountsThem) {
  auto pool = PoolWithQuotas(R"({"clients": {"alice": {"totalBytes": 500}}})");
  ImportedFile file;
  {
    ASSERT_OK_AND_ASSIGN(Reservation r, pool->Reserve("alice", "cpu:0", 300));
    std::move(r).Commit().HandOver({file.server_fd});
  }
  const PoolSnapshot s = pool->Snapshot();
  EXPECT_EQ(s.clients.at("alice").per_device[0].handed_over_bytes, 300u);
  EXPECT_EQ(s.clients.at("alice").total.peak_bytes, 300u);
  EXPECT_EQ(pool->AvailableTo("alice", 1), 200u);
  EXPECT_THAT(pool->Reserve("alice", "cpu:1", 300).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("already holds 300 B (300 bytes)"),
                             HasSubstr("300 B (300 bytes) of them in released "
                                       "handles its processes still map"))));
  // Another client is not charged for them (the device has room).
  ASSERT_OK_AND_ASSIGN(Reservation b, pool->Reserve("bob", "cpu:1", 900));
}

TEST(DevicePoolTest, DuplicateDeviceNamesAreRejected) {
  DeviceConfig cpu;
  cpu.name = "cpu";
  EXPECT_THAT(DevicePool::Create({cpu, cpu}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("listed twice")));
}

// --- admission against the driver's free memory ------------------------------

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Two virtual devices of 10 GiB each in the ledger; the fake driver reports
// on cpu:1 only, as if it were a GPU whose memory others also use.
struct DriverPool {
  FakeGpuDriver driver;
  std::unique_ptr<DevicePool> pool;

  explicit DriverPool(uint64_t headroom = 100 * kMiB) {
    std::vector<DeviceConfig> devices;
    for (int i = 0; i < 2; ++i) {
      DeviceConfig device;
      device.name = "cpu:" + std::to_string(i);
      device.ordinal = i;
      device.capacity_bytes = 10240 * kMiB;
      devices.push_back(device);
    }
    SetDriverFree(10240 * kMiB);
    pool = DevicePool::Create(devices, QuotaBook(),
                              DriverAdmission{&driver, headroom})
               .value();
  }

  void SetDriverFree(uint64_t free_bytes) {
    GpuMemorySample sample;
    sample.uuid = "GPU-fake-1";
    sample.total_bytes = 10240 * kMiB;
    sample.free_bytes = free_bytes;
    sample.used_bytes = sample.total_bytes - free_bytes;
    driver.Set("cpu:1", sample);
  }
};

TEST(DriverAdmissionTest, MemoryHeldElsewhereIsRefusedBeforeAllocation) {
  DriverPool p;
  // Another process holds all but 1 GiB of the GPU.
  p.SetDriverFree(1024 * kMiB);
  // The ledger alone would admit 2 GiB; the driver says no, with figures.
  EXPECT_THAT(
      p.pool->Reserve("alice", "cpu:1", 2048 * kMiB),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("placement \"cpu:1\""),
                     HasSubstr("needs 2.00 GiB (2147483648 bytes)"),
                     HasSubstr("driver reports only 1.00 GiB (1073741824 "
                               "bytes) free on cpu:1"),
                     HasSubstr("100.00 MiB (104857600 bytes) of it kept as "
                               "headroom"))));
  ExpectAllZero(*p.pool);
  // What fits under free - headroom is admitted.
  {
    ASSERT_OK_AND_ASSIGN(Reservation r,
                         p.pool->Reserve("alice", "cpu:1", 900 * kMiB));
    EXPECT_EQ(r.device().name, "cpu:1");
  }
  // Just over free - headroom is not.
  EXPECT_THAT(p.pool->Reserve("alice", "cpu:1", 925 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("GPU driver reports only")));
  ExpectAllZero(*p.pool);
}

TEST(DriverAdmissionTest, ReservationsInFlightCountAgainstDriverFreeBytes) {
  DriverPool p;
  p.SetDriverFree(2048 * kMiB);
  // Reserved but not allocated: the driver still shows it free, so the
  // pool must not hand it out twice.
  ASSERT_OK_AND_ASSIGN(Reservation first,
                       p.pool->Reserve("alice", "cpu:1", 1500 * kMiB));
  EXPECT_THAT(p.pool->Reserve("bob", "cpu:1", 500 * kMiB),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("1.46 GiB (1572864000 bytes) reserved for "
                                 "materializations in flight")));
  ASSERT_OK_AND_ASSIGN(Reservation second,
                       p.pool->Reserve("bob", "cpu:1", 400 * kMiB));
}

TEST(DriverAdmissionTest, AutoAndSplitAvoidTheFullGpu) {
  DriverPool p;
  p.SetDriverFree(500 * kMiB);
  // Best fit would pick either (equal ledger room); the driver rules cpu:1
  // out for 1 GiB.
  ASSERT_OK_AND_ASSIGN(Reservation r, p.pool->Reserve("alice", "auto",
                                                      1024 * kMiB));
  EXPECT_EQ(r.device().name, "cpu:0");
  EXPECT_EQ(p.pool->AvailableTo("alice", 1), 400 * kMiB);
  EXPECT_EQ(p.pool->FreeBytes(1), 10240 * kMiB);  // the ledger's own figure

  DevicePool::SplitRequest split;
  split.devices = {"cpu:1", "cpu:0"};
  split.unit_bytes = {300 * kMiB, 300 * kMiB};
  ASSERT_OK_AND_ASSIGN(DevicePool::SplitPlan plan,
                       p.pool->PlanSplit("alice", split));
  // 400 MiB of room on cpu:1: the first unit fits, the second goes on.
  EXPECT_THAT(plan.part_devices, ElementsAre(1, 0));
}

TEST(DriverAdmissionTest, NoDriverFigureLeavesTheLedgerToDecide) {
  DriverPool p;
  p.SetDriverFree(0);
  p.driver.SetError(absl::UnavailableError("driver not answering"));
  ASSERT_OK_AND_ASSIGN(Reservation r,
                       p.pool->Reserve("alice", "cpu:1", 4096 * kMiB));
  EXPECT_EQ(r.device().name, "cpu:1");
  p.driver.SetError(absl::OkStatus());
  p.driver.Remove("cpu:1");
  ASSERT_OK_AND_ASSIGN(Reservation s,
                       p.pool->Reserve("alice", "cpu:1", 4096 * kMiB));
}

}  // namespace
}  // namespace materializer::memory
