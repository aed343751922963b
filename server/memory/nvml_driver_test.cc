// requires-gpu: NVML against a real device. Skips, printing why, where
// there is no driver or no CUDA device.

#include "server/memory/nvml_driver.h"

#include <unistd.h>

#include <cstdio>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "gtest/gtest.h"
#include "server/memory/caching_allocator.h"
#include "server/memory/device.h"
#include "server/memory/gpu_report.h"
#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

class NvmlDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<GpuDriver>> nvml = LoadNvml();
    if (!nvml.ok()) {
      std::printf("requires-gpu: skipped: %s\n",
                  std::string(nvml.status().message()).c_str());
      GTEST_SKIP() << nvml.status();
    }
    if (CudaDeviceCount() == 0) {
      std::printf("requires-gpu: skipped: no CUDA device visible to LibTorch\n");
      GTEST_SKIP() << "no CUDA device";
    }
    driver_ = std::move(*nvml);
    device_.name = "cuda:0";
    device_.kind = DeviceKind::kCuda;
    device_.ordinal = 0;
  }

  std::unique_ptr<GpuDriver> driver_;
  DeviceConfig device_;
};

TEST_F(NvmlDriverTest, FiguresAddUpAndMatchTheCudaRuntime) {
  ASSERT_TRUE(driver_->Covers(device_));
  ASSERT_OK_AND_ASSIGN(GpuMemorySample s, driver_->Sample(device_, false));
  EXPECT_EQ(s.uuid.rfind("GPU-", 0), 0u) << s.uuid;
  EXPECT_FALSE(s.name.empty());
  EXPECT_GT(s.total_bytes, 0u);
  EXPECT_EQ(s.used_bytes + s.free_bytes, s.total_bytes);
  uint64_t cuda_free = 0;
  uint64_t cuda_total = 0;
  // The CUDA runtime must be loaded for this; LibTorch loads it.
  at::Tensor touch = at::zeros({1}, at::TensorOptions().device(at::kCUDA));
  ASSERT_OK(CudaMemoryInfo(0, &cuda_free, &cuda_total));
  EXPECT_EQ(s.total_bytes, cuda_total);
  EXPECT_TRUE(s.processes.empty());  // not asked for
}

TEST_F(NvmlDriverTest, ThisProcessAndItsCachingAllocatorBytesShowUp) {
  const uint64_t before = CachingAllocatorReservedBytes(0);
  at::Tensor big =
      at::empty({static_cast<int64_t>(256 * kMiB)},
                at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  const uint64_t cached = CachingAllocatorReservedBytes(0);
  EXPECT_GE(cached, before + 256 * kMiB);

  GpuReporter reporter(driver_.get(), GpuReporter::Options());
  ASSERT_OK_AND_ASSIGN(DriverReport report, reporter.Report(device_));
  // The driver charges this process at least the tensor (plus its
  // context); our own pid is not among the others.
  EXPECT_GE(report.server_process_bytes, 256 * kMiB);
  for (const GpuProcessReport& p : report.other_processes) {
    EXPECT_NE(p.pid, static_cast<uint32_t>(getpid()));
  }
  std::printf("cuda:0 %s: total %llu used %llu free %llu, this process %llu, "
              "caching allocator %llu, %zu other process(es)\n",
              report.name.c_str(),
              static_cast<unsigned long long>(report.total_bytes),
              static_cast<unsigned long long>(report.used_bytes),
              static_cast<unsigned long long>(report.free_bytes),
              static_cast<unsigned long long>(report.server_process_bytes),
              static_cast<unsigned long long>(cached),
              report.other_processes.size());
}

}  // namespace
}  // namespace materializer::memory
