#ifndef MATERIALIZER_TESTS_TESTING_TEST_SERVER_H_
#define MATERIALIZER_TESTS_TESTING_TEST_SERVER_H_

// An in-process materializerd on 127.0.0.1:0 and raw gRPC stubs to it, for
// end-to-end tests.
//
//   TestServer server;                       // CPU pool, 4 GiB
//   auto stub = server.Stub();
//   grpc::ClientContext context;
//   server.Identify(context, "alice");

#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "materializer/v1/materializer.grpc.pb.h"
#include "server/service/server.h"

namespace materializer::testing {

class TestServer {
 public:
  explicit TestServer(std::string cpu_capacity = "4GiB");
  ~TestServer();

  service::Server& server() { return *server_; }
  std::unique_ptr<v1::Materializer::Stub> Stub();

  // Names the caller in the development-mode metadata.
  static void Identify(grpc::ClientContext& context, const std::string& name);

  // GetStats as `client`; fails the test on error.
  v1::GetStatsResponse Stats(const std::string& client);

  // True when every device and total counter is zero.
  static bool AllZero(const v1::GetStatsResponse& stats);

 private:
  std::unique_ptr<service::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Reads a file from the test's runfiles (path relative to the workspace).
std::string ReadRunfile(const std::string& path);

}  // namespace materializer::testing

#endif  // MATERIALIZER_TESTS_TESTING_TEST_SERVER_H_
