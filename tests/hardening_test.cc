// The service under a careless client, through gRPC in one process (so the
// concurrency of the worker pool and the reactors also runs under TSan):
// fetches cancelled mid-stream and before they start, bytes that do not
// parse, and many clients at once.

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace materializer {
namespace {

using testing::TestServer;

v1::MaterializeRequest Model(int tensors, int64_t elements) {
  v1::MaterializeRequest request;
  for (int i = 0; i < tensors; ++i) {
    v1::TensorSpec* t = request.mutable_model()->add_tensors();
    t->set_name("layer." + std::to_string(i) + ".weight");
    t->add_shape(elements);
    t->set_dtype("float32");
  }
  v1::InitRule* rule = request.mutable_model()->add_init_rules();
  rule->set_pattern("*");
  rule->mutable_init()->mutable_ones();
  return request;
}

std::string Materialize(TestServer& server, const std::string& client,
                        const v1::MaterializeRequest& request) {
  grpc::ClientContext context;
  TestServer::Identify(context, client);
  v1::MaterializeResponse response;
  grpc::Status status =
      server.Stub()->Materialize(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.handle();
}

void Release(TestServer& server, const std::string& client,
             const std::string& handle) {
  grpc::ClientContext context;
  TestServer::Identify(context, client);
  v1::ReleaseRequest request;
  request.set_handle(handle);
  v1::ReleaseResponse response;
  grpc::Status status = server.Stub()->Release(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(HardeningTest, FetchesCancelledMidStreamAndBeforeTheyStart) {
  TestServer server;
  // 64 MiB in 16 tensors: 16 chunks of 4 MiB.
  const std::string handle =
      Materialize(server, "alice", Model(16, (4 << 20) / 4));
  for (int round = 0; round < 8; ++round) {
    grpc::ClientContext context;
    TestServer::Identify(context, "alice");
    v1::FetchRequest fetch;
    fetch.set_handle(handle);
    auto reader = server.Stub()->FetchWeights(&context, fetch);
    v1::WeightChunk chunk;
    // Cancel after `round` chunks (0: possibly before the open ran).
    for (int read = 0; read < round && reader->Read(&chunk); ++read) {
    }
    context.TryCancel();
    while (reader->Read(&chunk)) {
    }
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
        << round << ": " << status.error_message();
  }
  // A whole fetch still works, and releasing frees everything.
  {
    grpc::ClientContext context;
    TestServer::Identify(context, "alice");
    v1::FetchRequest fetch;
    fetch.set_handle(handle);
    fetch.set_format(v1::WEIGHT_FORMAT_RAW);
    auto reader = server.Stub()->FetchWeights(&context, fetch);
    v1::WeightChunk chunk;
    uint64_t bytes = 0;
    uint64_t total = 0;
    while (reader->Read(&chunk)) {
      bytes += chunk.data().size();
      total = chunk.total_bytes();
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(bytes, total);
    EXPECT_EQ(total, 64u << 20);
  }
  Release(server, "alice", handle);
  EXPECT_TRUE(TestServer::AllZero(server.Stats("alice")));
}

TEST(HardeningTest, UnparseableRequestsAreInvalidArgumentNamingTheMessage) {
  TestServer server;
  auto channel = grpc::CreateChannel(server.server().address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const char garbage[] = "\x0f\xff\xff\xff";
  for (const char* method : {"Plan", "Describe", "GetStats", "Release"}) {
    grpc::Slice slice(garbage, sizeof(garbage) - 1);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext context;
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(
        &context, std::string("/materializer.v1.Materializer/") + method,
        grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
          status = std::move(s);
          done.Notify();
        });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method;
    EXPECT_NE(status.error_message().find("materializer.v1."),
              std::string::npos)
        << status.error_message();
  }
}

TEST(HardeningTest, ManyClientsAtOnceEachSeeTheirOwn) {
  TestServer server;
  constexpr int kClients = 6;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      const std::string client = "client-" + std::to_string(c);
      for (int i = 0; i < 5; ++i) {
        const std::string handle = Materialize(server, client, Model(4, 1024));
        grpc::ClientContext context;
        TestServer::Identify(context, client);
        v1::ListHandlesResponse list;
        grpc::Status status = server.Stub()->ListHandles(
            &context, v1::ListHandlesRequest(), &list);
        if (!status.ok() || list.handles_size() != 1 ||
            list.handles(0).handle() != handle) {
          failures.fetch_add(1);
        }
        Release(server, client, handle);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(TestServer::AllZero(server.Stats("client-0")));
}

}  // namespace
}  // namespace materializer
