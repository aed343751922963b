#include "server/service/server_info.h"

#include "tests/testing/status_matchers.h"

namespace materializer::service {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

MATCHER_P(IsOkAndHolds, value, "is OK and holds " + std::string(value)) {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  *result_listener << "holds \"" << *arg << "\"";
  return *arg == value;
}

TEST(ReplicaNameForTest, AnExplicitNameWins) {
  EXPECT_THAT(ReplicaNameFor("r0", "pod-7.svc:50051", "host"),
              IsOkAndHolds("r0"));
  EXPECT_THAT(ReplicaNameFor("R0", "", "host"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--replica: replica name \"R0\"")));
}

TEST(ReplicaNameForTest, WithoutFlagsTheServerIsSingle) {
  EXPECT_THAT(ReplicaNameFor("", "", "host-1"), IsOkAndHolds(""));
}

TEST(ReplicaNameForTest, DerivedFromTheAdvertisedHostsFirstLabel) {
  EXPECT_THAT(ReplicaNameFor(
                  "", "Materializer-1.materializer.ml.svc.cluster.local:50051",
                  "ignored"),
              IsOkAndHolds("materializer-1"));
}

TEST(ReplicaNameForTest, AnIpAddressTakesTheHostName) {
  EXPECT_THAT(ReplicaNameFor("", "10.0.0.7:50051", "Node-3.example"),
              IsOkAndHolds("node-3"));
  EXPECT_THAT(ReplicaNameFor("", "[::1]:50051", "node-4"),
              IsOkAndHolds("node-4"));
  EXPECT_THAT(
      ReplicaNameFor("", "127.0.0.1:50051", "under_score"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("set --replica")));
}

TEST(ReplicaNameForTest, AdvertiseMustBeHostAndPort) {
  for (const char* bad :
       {"pod-1", ":50051", "pod-1:", "pod-1:0", "pod-1:70000", "pod-1:http"}) {
    EXPECT_THAT(ReplicaNameFor("", bad, "host"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("must be host:port")))
        << bad;
  }
}

TEST(ServerInfoFromStatsTest, FreeIsCapacityLessReservedAndInUse) {
  v1::GetStatsResponse stats;
  v1::DeviceStats* cpu = stats.add_devices();
  cpu->set_device("cpu:0");
  cpu->set_capacity_bytes(1000);
  cpu->set_reserved_bytes(100);
  cpu->set_in_use_bytes(250);
  v1::DeviceStats* full = stats.add_devices();
  full->set_device("cpu:1");
  full->set_capacity_bytes(1000);
  full->set_in_use_bytes(1200);  // a released arena kept by a fetch
  const v1::ServerInfo info = ServerInfoFromStats("r1", "10.0.0.1:5", stats);
  EXPECT_EQ(info.replica(), "r1");
  EXPECT_EQ(info.advertised_address(), "10.0.0.1:5");
  ASSERT_EQ(info.devices_size(), 2);
  EXPECT_EQ(info.devices(0).device(), "cpu:0");
  EXPECT_EQ(info.devices(0).capacity_bytes(), 1000u);
  EXPECT_EQ(info.devices(0).free_bytes(), 650u);
  EXPECT_EQ(info.devices(1).free_bytes(), 0u);
}

}  // namespace
}  // namespace materializer::service
