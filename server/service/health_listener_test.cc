#include "server/service/health_listener.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace materializer::service {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr char kService[] = "materializer.v1.Materializer";

std::shared_ptr<grpc::Channel> Connect(const HealthListener& listener) {
  return grpc::CreateChannel(listener.address(),
                             grpc::InsecureChannelCredentials());
}

// The status of `service`, or the call's error code as a negative number.
int Check(const std::shared_ptr<grpc::Channel>& channel,
          const std::string& service) {
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::Status status =
      Health::NewStub(channel)->Check(&context, request, &response);
  if (!status.ok()) return -static_cast<int>(status.error_code());
  return response.status();
}

TEST(HealthListenerTest, ServesTheNamedServicesUntilADrainBegins) {
  absl::StatusOr<std::unique_ptr<HealthListener>> listener =
      HealthListener::Start("127.0.0.1:0", {"", kService});
  ASSERT_TRUE(listener.ok()) << listener.status();
  EXPECT_NE((*listener)->address(), "127.0.0.1:0");
  auto channel = Connect(**listener);
  EXPECT_EQ(Check(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(channel, kService), HealthCheckResponse::SERVING);
  EXPECT_EQ(Check(channel, "other.Service"),
            -static_cast<int>(grpc::StatusCode::NOT_FOUND));

  (*listener)->SetNotServing();
  EXPECT_EQ(Check(channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(channel, kService), HealthCheckResponse::NOT_SERVING);

  (*listener)->Shutdown();
  (*listener)->Shutdown();  // idempotent
  EXPECT_EQ(Check(channel, ""),
            -static_cast<int>(grpc::StatusCode::UNAVAILABLE));
}

TEST(HealthListenerTest, AnswersEveryOtherMethodUnimplemented) {
  absl::StatusOr<std::unique_ptr<HealthListener>> listener =
      HealthListener::Start("127.0.0.1:0", {""});
  ASSERT_TRUE(listener.ok()) << listener.status();
  grpc::GenericStub stub(Connect(**listener));
  for (const char* method :
       {"/materializer.v1.Materializer/GetStats",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);  // an empty message
    grpc::ByteBuffer response;
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> lock(mu);
                     status = std::move(s);
                     done = true;
                     done_cv.notify_one();
                   });
    std::unique_lock<std::mutex> lock(mu);
    done_cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    EXPECT_NE(status.error_message().find("serves only grpc.health.v1"),
              std::string::npos)
        << status.error_message();
  }
}

TEST(HealthListenerTest, AnAddressInUseIsUnavailable) {
  absl::StatusOr<std::unique_ptr<HealthListener>> first =
      HealthListener::Start("127.0.0.1:0", {""});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<HealthListener>> second =
      HealthListener::Start((*first)->address(), {""});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find((*first)->address()),
            std::string::npos);
}

}  // namespace
}  // namespace materializer::service
