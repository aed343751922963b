#include "client/cli/exit_code.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::client::cli {
namespace {

TEST(ExitCodeForTest, OneCodePerOutcome) {
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("h"), false), kExitNotFound);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("x"), true), kExitDenied);
  EXPECT_EQ(ExitCodeFor(absl::PermissionDeniedError("x"), false), kExitDenied);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("x"), false),
            kExitExhausted);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x"), false), kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x"), false),
            kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::DataLossError("x"), false), kExitDataLoss);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x"), false), kExitFailure);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("x"), false),
            kExitFailure);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x"), false), kExitFailure);
}

// gRPC's messages, as the client library reports them.
constexpr char kUntrustedServer[] =
    "failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.1:45377: Ssl handshake failed: SSL_ERROR_SSL: "
    "error:0A000086:SSL routines::certificate verify failed";
constexpr char kClosedDuringHandshake[] =
    "failed to connect to all addresses; last error: UNAVAILABLE: "
    "ipv4:127.0.0.1:45377: Socket closed";
constexpr char kRefused[] =
    "failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused";

TEST(ExitCodeForTest, CertificateFailuresAreDenialsNotOutages) {
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError(kUntrustedServer), true),
            kExitDenied);
  // Over TLS, a connection closed in the handshake is a refused (or
  // missing) client certificate; without TLS it is a plaintext client at a
  // TLS server, or a server going away.
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError(kClosedDuringHandshake), true),
            kExitDenied);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError(kClosedDuringHandshake), false),
            kExitUnavailable);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError(kRefused), true),
            kExitUnavailable);
}

TEST(ExitCodeTableTest, EveryCodeOnceInOrder) {
  std::set<int> seen;
  int previous = -1;
  for (const ExitCodeRow& row : ExitCodeTable()) {
    EXPECT_GT(static_cast<int>(row.code), previous);
    previous = row.code;
    EXPECT_TRUE(seen.insert(row.code).second);
    EXPECT_STRNE(row.meaning, "");
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace materializer::client::cli
