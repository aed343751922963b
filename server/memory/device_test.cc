#include "server/memory/device.h"

#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ConfigureDevicesTest, VirtualCpuDevicesWithTheirOwnCapacities) {
  PoolOptions options;
  options.devices = "cpu:4";
  options.cpu_capacity = "1GiB,2GiB,3GiB,4GiB";
  ASSERT_OK_AND_ASSIGN(std::vector<DeviceConfig> devices,
                       ConfigureDevices(options));
  ASSERT_EQ(devices.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(devices[i].name, "cpu:" + std::to_string(i));
    EXPECT_EQ(devices[i].kind, DeviceKind::kCpu);
    EXPECT_EQ(devices[i].ordinal, i);
    EXPECT_EQ(devices[i].capacity_bytes, uint64_t(i + 1) << 30);
  }
}

TEST(ConfigureDevicesTest, OneCapacityIsSplitEqually) {
  PoolOptions options;
  options.devices = "cpu:2";
  options.cpu_capacity = "1GiB";
  ASSERT_OK_AND_ASSIGN(std::vector<DeviceConfig> devices,
                       ConfigureDevices(options));
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].capacity_bytes, 512u << 20);
  EXPECT_EQ(devices[1].capacity_bytes, 512u << 20);
}

TEST(ConfigureDevicesTest, PlainCpuAndErrors) {
  PoolOptions options;
  options.devices = "cpu";
  options.cpu_capacity = "3GiB";
  ASSERT_OK_AND_ASSIGN(std::vector<DeviceConfig> devices,
                       ConfigureDevices(options));
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].name, "cpu");
  EXPECT_EQ(devices[0].capacity_bytes, 3ull << 30);

  options.devices = "cpu:0";
  EXPECT_THAT(ConfigureDevices(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 <= N <= 64")));
  options.devices = "cpu:3";
  options.cpu_capacity = "1GiB,2GiB";
  EXPECT_THAT(ConfigureDevices(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("lists 2 values for 3")));
  options.devices = "tpu:0";
  EXPECT_THAT(ConfigureDevices(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not a device")));
  options.devices = "cuda:0";  // no GPU in the test environment
  if (CudaDeviceCount() == 0) {
    EXPECT_THAT(ConfigureDevices(options).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("not available")));
  }
}

}  // namespace
}  // namespace materializer::memory
