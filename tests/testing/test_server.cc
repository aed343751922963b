#include "tests/testing/test_server.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/service/auth.h"

namespace materializer::testing {

TestServer::TestServer(std::string cpu_capacity) {
  service::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.pool.devices = "cpu";
  options.pool.cpu_capacity = std::move(cpu_capacity);
  options.workers = 2;
  absl::StatusOr<std::unique_ptr<service::Server>> server =
      service::Server::Start(options);
  if (!server.ok()) {
    ADD_FAILURE() << "server did not start: " << server.status();
    std::abort();
  }
  server_ = std::move(*server);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  channel_ = grpc::CreateCustomChannel(
      server_->address(), grpc::InsecureChannelCredentials(), args);
}

TestServer::~TestServer() { server_->Shutdown(absl::Seconds(10)); }

std::unique_ptr<v1::Materializer::Stub> TestServer::Stub() {
  return v1::Materializer::NewStub(channel_);
}

void TestServer::Identify(grpc::ClientContext& context,
                          const std::string& name) {
  context.AddMetadata(service::kClientMetadataKey, name);
}

v1::GetStatsResponse TestServer::Stats(const std::string& client) {
  grpc::ClientContext context;
  Identify(context, client);
  v1::GetStatsResponse stats;
  grpc::Status status =
      Stub()->GetStats(&context, v1::GetStatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

bool TestServer::AllZero(const v1::GetStatsResponse& stats) {
  for (const v1::DeviceStats& device : stats.devices()) {
    if (device.reserved_bytes() != 0 || device.in_use_bytes() != 0 ||
        device.handles() != 0) {
      return false;
    }
  }
  return stats.reserved_bytes() == 0 && stats.in_use_bytes() == 0 &&
         stats.handles() == 0 && stats.clients_size() == 0;
}

std::string ReadRunfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string full =
      srcdir != nullptr && workspace != nullptr
          ? std::string(srcdir) + "/" + workspace + "/" + path
          : path;
  std::ifstream file(full, std::ios::binary);
  if (!file) {
    ADD_FAILURE() << "cannot read " << full;
    return "";
  }
  std::ostringstream out;
  out << file.rdbuf();
  return out.str();
}

}  // namespace materializer::testing
