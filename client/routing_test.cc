#include "client/routing.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::client {
namespace {

using ::testing::Eq;
using ::testing::Optional;

v1::ServerInfo Replica(
    const std::string& name,
    std::vector<std::pair<std::string, uint64_t>> free_by_device) {
  v1::ServerInfo info;
  info.set_replica(name);
  for (const auto& [device, free] : free_by_device) {
    v1::DeviceRoom* room = info.add_devices();
    room->set_device(device);
    room->set_free_bytes(free);
  }
  return info;
}

v1::Placement On(const std::string& device) {
  v1::Placement placement;
  placement.set_device(device);
  return placement;
}

TEST(RoomForTest, AutoTakesTheLargestDevice) {
  const v1::ServerInfo r = Replica("r0", {{"cuda:0", 10}, {"cuda:1", 30}});
  EXPECT_THAT(RoomFor(r, On("")), Optional(Eq(30u)));
  EXPECT_THAT(RoomFor(r, On("auto")), Optional(Eq(30u)));
}

TEST(RoomForTest, AKindOrADeviceLimitsTheCandidates) {
  const v1::ServerInfo r =
      Replica("r0", {{"cpu", 100}, {"cuda:0", 10}, {"cuda:1", 30}});
  EXPECT_THAT(RoomFor(r, On("cuda")), Optional(Eq(30u)));
  EXPECT_THAT(RoomFor(r, On("cuda:0")), Optional(Eq(10u)));
  EXPECT_THAT(RoomFor(r, On("cpu")), Optional(Eq(100u)));
  EXPECT_EQ(RoomFor(r, On("cuda:2")), std::nullopt);
  const v1::ServerInfo cpus = Replica("r1", {{"cpu:0", 5}, {"cpu:1", 7}});
  EXPECT_THAT(RoomFor(cpus, On("cpu")), Optional(Eq(7u)));
  EXPECT_EQ(RoomFor(cpus, On("cuda")), std::nullopt);
}

TEST(RoomForTest, SplitAddsUpTheListedDevices) {
  const v1::ServerInfo r =
      Replica("r0", {{"cuda:0", 10}, {"cuda:1", 30}, {"cuda:2", 5}});
  v1::Placement split = On("split");
  EXPECT_THAT(RoomFor(r, split), Optional(Eq(45u)));
  split.mutable_split()->add_devices("cuda:0");
  split.mutable_split()->add_devices("cuda:2");
  EXPECT_THAT(RoomFor(r, split), Optional(Eq(15u)));
}

TEST(ChooseReplicaTest, TheMostRoomWinsAndTiesGoToTheFirst) {
  const std::vector<v1::ServerInfo> replicas = {
      Replica("r0", {{"cpu", 1000}}),
      Replica("r1", {{"cpu", 3000}}),
      Replica("r2", {{"cpu", 3000}}),
  };
  EXPECT_EQ(ChooseReplica(replicas, On("auto")), 1u);
}

TEST(ChooseReplicaTest, OnlyReplicasWithTheKindCount) {
  const std::vector<v1::ServerInfo> replicas = {
      Replica("cpu-only", {{"cpu", 1u << 30}}),
      Replica("gpu", {{"cpu", 10}, {"cuda:0", 100}}),
  };
  EXPECT_EQ(ChooseReplica(replicas, On("cuda")), 1u);
  EXPECT_EQ(ChooseReplica(replicas, On("cpu")), 0u);
  // Nobody has cuda:5: the first replica's answer will say so.
  EXPECT_EQ(ChooseReplica(replicas, On("cuda:5")), 0u);
}

}  // namespace
}  // namespace materializer::client
