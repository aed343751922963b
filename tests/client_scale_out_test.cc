// The C++ client against two real servers started as replicas: handles go
// to the replica with the most room and carry its name, each call for a
// handle reaches its replica, the client holds a session on every replica
// it materializes on, and when the client goes away each replica frees
// what it holds there. A replica that shuts down is reported by name while
// the other keeps serving.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "server/registry/registry.h"
#include "server/service/server.h"
#include "tests/testing/status_matchers.h"

namespace materializer {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::EndsWith;
using ::testing::HasSubstr;

v1::MaterializeRequest Model(int64_t floats) {
  v1::MaterializeRequest request;
  v1::TensorSpec* t = request.mutable_model()->add_tensors();
  t->set_name("w");
  t->add_shape(floats);
  t->set_dtype("float32");
  v1::InitRule* rule = request.mutable_model()->add_init_rules();
  rule->set_pattern("*");
  rule->mutable_init()->mutable_ones();
  return request;
}

std::unique_ptr<service::Server> StartReplica(const std::string& name,
                                              const std::string& capacity) {
  service::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.replica = name;
  options.pool.devices = "cpu";
  options.pool.cpu_capacity = capacity;
  options.session_grace = absl::Milliseconds(200);
  options.reap_interval = absl::Milliseconds(20);
  return service::Server::Start(options).value();
}

// True once `server` holds no handle and no byte (a release unregisters
// the handle first and returns its bytes just after).
bool WaitUntilEmpty(service::Server& server) {
  auto empty = [&server] {
    return server.registry().size() == 0 &&
           server.pool().Snapshot().total.in_use_bytes == 0;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return empty();
}

TEST(ClientScaleOutTest, SessionsOnEachReplicaAndCleanupOnEach) {
  std::unique_ptr<service::Server> r0 = StartReplica("r0", "32MiB");
  std::unique_ptr<service::Server> r1 = StartReplica("r1", "48MiB");
  client::ClientOptions options;
  options.target = absl::StrCat(r0->address(), ",", r1->address());
  options.client_name = "trainer";
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::Client> trainer,
                         client::Client::Connect(options));
    // 24 MiB: r1 has the most room (48 MiB), then r0 (32 > 24 left).
    ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse first,
                         trainer->Materialize(Model(6 << 20)));
    ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse second,
                         trainer->Materialize(Model(6 << 20)));
    EXPECT_THAT(first.handle(), EndsWith("@r1"));
    EXPECT_THAT(second.handle(), EndsWith("@r0"));
    EXPECT_EQ(r1->registry().size(), 1u);
    EXPECT_EQ(r0->registry().size(), 1u);

    // Each handle is bound to the session on its own replica.
    for (const std::string& handle : {first.handle(), second.handle()}) {
      ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, trainer->Describe(handle));
      ASSERT_OK_AND_ASSIGN(std::string session, trainer->SessionIdOf(handle));
      EXPECT_EQ(info.session(), session);
      EXPECT_FALSE(session.empty());
    }
    EXPECT_NE(trainer->SessionIdOf(first.handle()).value(),
              trainer->SessionIdOf(second.handle()).value());
    ASSERT_OK_AND_ASSIGN(client::HandleList list, trainer->ListHandles());
    EXPECT_EQ(list.handles.handles_size(), 2);
  }  // the trainer goes: its session on each replica ends
  EXPECT_TRUE(WaitUntilEmpty(*r0));
  EXPECT_TRUE(WaitUntilEmpty(*r1));
}

TEST(ClientScaleOutTest, AReplicaThatShutsDownIsNamedAndTheOtherServes) {
  std::unique_ptr<service::Server> r0 = StartReplica("r0", "32MiB");
  std::unique_ptr<service::Server> r1 = StartReplica("r1", "48MiB");
  client::ClientOptions options;
  options.target = absl::StrCat(r0->address(), ",", r1->address());
  options.session = false;
  options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::Client> cli,
                       client::Client::Connect(options));
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse on_r1,
                       cli->Materialize(Model(1024)));
  r0->Shutdown(absl::Seconds(1));  // r0 goes (r1 had the most room)
  ASSERT_THAT(on_r1.handle(), EndsWith("@r1"));
  EXPECT_THAT(cli->Describe(on_r1.handle()), IsOk());
  EXPECT_THAT(cli->Describe("h-00000000000000000000000000000000@r0"),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr(absl::StrCat("replica r0 (", r0->address(),
                                              ") did not answer"))));
  ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse again,
                       cli->Materialize(Model(1024)));
  EXPECT_THAT(again.handle(), EndsWith("@r1"));
  ASSERT_OK_AND_ASSIGN(client::HandleList list, cli->ListHandles());
  EXPECT_EQ(list.handles.handles_size(), 2);
  ASSERT_EQ(list.failed.size(), 1u);
  EXPECT_EQ(list.failed[0].address, r0->address());
  EXPECT_THAT(cli->Release(on_r1.handle()), IsOk());
  EXPECT_THAT(cli->Release(again.handle()), IsOk());
}

}  // namespace
}  // namespace materializer
