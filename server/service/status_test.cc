#include "server/service/status.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace materializer::service {
namespace {

size_t WireSize(const std::string& message) {
  size_t n = 0;
  for (char c : message) {
    const unsigned char u = static_cast<unsigned char>(c);
    n += u < 0x20 || u > 0x7e || u == '%' ? 3 : 1;
  }
  return n;
}

TEST(ToGrpcStatusTest, KeepsCodeAndShortMessages) {
  grpc::Status s = ToGrpcStatus(absl::NotFoundError("handle \"h-1\" not found"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "handle \"h-1\" not found");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(ToGrpcStatusTest, LongMessagesKeepBothEndsWithinTheWireBound) {
  const std::string middle(1 << 20, 'x');
  grpc::Status s = ToGrpcStatus(absl::InvalidArgumentError(
      "model.tensors[0] (" + middle + "): name is too long. Shorten it"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LE(WireSize(s.error_message()), kMaxStatusWireBytes);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "model.tensors[0] ("));
  EXPECT_TRUE(absl::EndsWith(s.error_message(), "Shorten it"));
  EXPECT_TRUE(absl::StrContains(s.error_message(), "bytes of this message cut"));
  // Bytes that are percent-encoded on the wire count three times.
  grpc::Status binary = ToGrpcStatus(
      absl::InvalidArgumentError(std::string(100000, '%')));
  EXPECT_LE(WireSize(binary.error_message()), kMaxStatusWireBytes);
  EXPECT_GT(binary.error_message().size(), 1000u);
}

TEST(EndCallTest, ConvertsLikeToGrpcStatus) {
  grpc::Status s = EndCall("Plan", absl::CancelledError("gone"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(s.error_message(), "gone");
}

}  // namespace
}  // namespace materializer::service
