#include "server/registry/handle_id.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::registry {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;

TEST(NewHandleIdTest, WithoutAReplicaIdsKeepTheSingleServerForm) {
  std::set<std::string> ids;
  for (int i = 0; i < 10000; ++i) {
    const std::string id = NewHandleId();
    ASSERT_THAT(id, MatchesRegex("h-[0-9a-f]{32}"));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 10000u);
}

TEST(NewHandleIdTest, AReplicasIdsNameItAfterTheRandomPart) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewHandleId("materializer-1");
    ASSERT_THAT(id, MatchesRegex("h-[0-9a-f]{32}@materializer-1"));
    EXPECT_EQ(ReplicaOfId(id), "materializer-1");
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 1000u);  // still 128 random bits each
}

TEST(ReplicaOfIdTest, HandleAndExportIdsNameTheSameReplica) {
  EXPECT_EQ(ReplicaOfId("h-0123456789abcdef0123456789abcdef"), "");
  EXPECT_EQ(ReplicaOfId("h-0123456789abcdef0123456789abcdef@r0"), "r0");
  EXPECT_EQ(ReplicaOfId("x-ffffffffffffffffffffffffffffffff-"
                        "h-0123456789abcdef0123456789abcdef@pod-2"),
            "pod-2");
  EXPECT_EQ(ReplicaOfId(""), "");
  EXPECT_EQ(ReplicaOfId("garbage@"), "");
}

TEST(ReplicaNameProblemTest, AcceptsDnsLabelsOnly) {
  for (const char* good : {"r0", "materializer-1", "a", "0",
                           "abcdefghijklmnopqrstuvwxyz-0123456789"}) {
    EXPECT_THAT(ReplicaNameProblem(good), IsEmpty()) << good;
  }
  EXPECT_THAT(ReplicaNameProblem(""), HasSubstr("1 to 63"));
  EXPECT_THAT(ReplicaNameProblem(std::string(64, 'a')), HasSubstr("1 to 63"));
  EXPECT_THAT(ReplicaNameProblem("Pod-1"), HasSubstr("a-z, 0-9"));
  EXPECT_THAT(ReplicaNameProblem("pod.ns"), HasSubstr("a-z, 0-9"));
  EXPECT_THAT(ReplicaNameProblem("pod@1"), HasSubstr("a-z, 0-9"));
  EXPECT_THAT(ReplicaNameProblem("-pod"), HasSubstr("start and end"));
  EXPECT_THAT(ReplicaNameProblem("pod-"), HasSubstr("start and end"));
}

}  // namespace
}  // namespace materializer::registry
