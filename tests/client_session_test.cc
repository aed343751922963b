// The C++ client library keeps a session for its lifetime: handles it
// materializes are bound to it, and they go when the client goes.

#include <memory>

#include "absl/time/clock.h"
#include "client/client.h"
#include "server/service/server.h"
#include "tests/testing/status_matchers.h"

namespace materializer {
namespace {

using ::materializer::testing::IsOk;

v1::MaterializeRequest SmallModel() {
  v1::MaterializeRequest request;
  v1::TensorSpec* t = request.mutable_model()->add_tensors();
  t->set_name("w");
  t->add_shape(1024);
  t->set_dtype("float32");
  v1::InitRule* rule = request.mutable_model()->add_init_rules();
  rule->set_pattern("*");
  rule->mutable_init()->mutable_ones();
  return request;
}

std::unique_ptr<service::Server> StartServer(absl::Duration grace) {
  service::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.pool.devices = "cpu";
  options.pool.cpu_capacity = "1GiB";
  options.session_grace = grace;
  options.reap_interval = absl::Milliseconds(20);
  return service::Server::Start(options).value();
}

TEST(ClientSessionTest, HandlesAreBoundToTheClientsSessionAndGoWithIt) {
  std::unique_ptr<service::Server> server =
      StartServer(absl::Milliseconds(300));
  client::ClientOptions options;
  options.target = server->address();
  options.client_name = "trainer";
  std::string handle;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::Client> trainer,
                         client::Client::Connect(options));
    ASSERT_OK_AND_ASSIGN(std::string session, trainer->SessionId());
    ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse m,
                         trainer->Materialize(SmallModel()));
    handle = m.handle();
    ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, trainer->Describe(handle));
    EXPECT_EQ(info.session(), session);
    EXPECT_FALSE(info.has_lease_expires_at());
    EXPECT_EQ(server->pool().Snapshot().total.handles, 1u);
  }  // the client goes away: its session ends
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server->pool().Snapshot().total.handles != 0 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const memory::PoolSnapshot snapshot = server->pool().Snapshot();
  EXPECT_EQ(snapshot.total.handles, 0u);
  EXPECT_EQ(snapshot.total.in_use_bytes, 0u);
  EXPECT_EQ(server->registry().size(), 0u);
}

TEST(ClientSessionTest, WithoutASessionHandlesAreDetachedAndLeased) {
  std::unique_ptr<service::Server> server = StartServer(absl::ZeroDuration());
  client::ClientOptions options;
  options.target = server->address();
  options.session = false;
  std::string handle;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::Client> cli,
                         client::Client::Connect(options));
    EXPECT_FALSE(cli->SessionId().ok());
    ASSERT_OK_AND_ASSIGN(v1::MaterializeResponse m,
                         cli->Materialize(SmallModel()));
    handle = m.handle();
    ASSERT_OK_AND_ASSIGN(v1::HandleInfo info, cli->Describe(handle));
    EXPECT_TRUE(info.session().empty());
    EXPECT_TRUE(info.has_lease_expires_at());
    ASSERT_OK_AND_ASSIGN(v1::RenewResponse renewed, cli->Renew(handle));
    EXPECT_GE(renewed.lease_expires_at().seconds(),
              info.lease_expires_at().seconds());
  }
  // The client is gone; the detached handle stays (until its lease lapses).
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(server->registry().size(), 1u);
}

}  // namespace
}  // namespace materializer
