#include "client/targets.h"

#include "tests/testing/status_matchers.h"

namespace materializer::client {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(SplitTargetTest, ListsAndSingleAddresses) {
  ASSERT_OK_AND_ASSIGN(auto one, SplitTarget("127.0.0.1:50051"));
  EXPECT_THAT(one, ElementsAre("127.0.0.1:50051"));
  ASSERT_OK_AND_ASSIGN(
      auto several, SplitTarget(" 127.0.0.1:7001, [::1]:7002,pod-2.svc:7003"));
  EXPECT_THAT(several,
              ElementsAre("127.0.0.1:7001", "[::1]:7002", "pod-2.svc:7003"));
}

TEST(SplitTargetTest, SchemeTargetsAreOneEntryAsTheyAre) {
  ASSERT_OK_AND_ASSIGN(auto unix_socket, SplitTarget("unix:/run/m.sock"));
  EXPECT_THAT(unix_socket, ElementsAre("unix:/run/m.sock"));
  ASSERT_OK_AND_ASSIGN(auto dns, SplitTarget("dns:///a:1,b:2"));
  EXPECT_THAT(dns, ElementsAre("dns:///a:1,b:2"));
}

TEST(SplitTargetTest, RejectsWhatIsNotHostAndPort) {
  EXPECT_THAT(SplitTarget(""), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("is empty")));
  EXPECT_THAT(
      SplitTarget("a:1,,b:2"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty item")));
  for (const char* bad : {"localhost", "a:1,b", ":50051", "a:0", "a:99999"}) {
    EXPECT_THAT(SplitTarget(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("is not host:port")))
        << bad;
  }
}

TEST(ResolveTargetTest, IpAddressesAreTakenAsTheyAre) {
  ASSERT_OK_AND_ASSIGN(
      Resolved resolved,
      ResolveTarget("127.0.0.1:7001,[::1]:7002,127.0.0.1:7001"));
  EXPECT_THAT(resolved.endpoints, ElementsAre(Endpoint{"127.0.0.1:7001", ""},
                                              Endpoint{"[::1]:7002", ""}));
  EXPECT_THAT(resolved.failures, IsEmpty());
}

TEST(ResolveTargetTest, LocalhostIsOneServerCheckedByItsName) {
  // localhost has an IPv4 and (usually) an IPv6 address; only the IPv4 one
  // counts, so it is one server, not two replicas.
  ASSERT_OK_AND_ASSIGN(Resolved resolved, ResolveTarget("localhost:50051"));
  EXPECT_THAT(resolved.endpoints,
              ElementsAre(Endpoint{"127.0.0.1:50051", "localhost"}));
}

TEST(ResolveTargetTest, ANameThatDoesNotResolveIsAFailureNotAnError) {
  ASSERT_OK_AND_ASSIGN(Resolved resolved,
                       ResolveTarget("127.0.0.1:1,no-such-host.invalid:2"));
  EXPECT_THAT(resolved.endpoints, ElementsAre(Endpoint{"127.0.0.1:1", ""}));
  ASSERT_EQ(resolved.failures.size(), 1u);
  EXPECT_THAT(resolved.failures[0],
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("cannot look up no-such-host.invalid")));
}

}  // namespace
}  // namespace materializer::client
