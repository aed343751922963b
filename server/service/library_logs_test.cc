#include "server/service/library_logs.h"

#include <string>
#include <vector>

#include "absl/base/internal/raw_logging.h"
#include "absl/synchronization/mutex.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "gtest/gtest.h"
#include "server/common/log.h"

namespace materializer::service {
namespace {

absl::Mutex lines_mu;
std::vector<std::string>* lines ABSL_GUARDED_BY(lines_mu) =
    new std::vector<std::string>();

void Capture(absl::string_view line) {
  absl::MutexLock lock(&lines_mu);
  lines->emplace_back(line);
}

std::vector<std::string> TakeLines() {
  absl::MutexLock lock(&lines_mu);
  std::vector<std::string> taken;
  taken.swap(*lines);
  return taken;
}

class LibraryLogsTest : public ::testing::Test {
 protected:
  // As in the server, gRPC is initialized (which sets its verbosity).
  static void SetUpTestSuite() { grpc_init(); }
  static void TearDownTestSuite() { grpc_shutdown(); }

  void SetUp() override {
    log::internal::SetWriterForTest(Capture);
    log::SetFormat(log::Format::kJson);
    log::SetMinLevel(log::Level::kInfo);
    RouteLibraryLogs();
    TakeLines();
  }
  void TearDown() override {
    log::internal::SetWriterForTest(nullptr);
    log::SetFormat(log::Format::kText);
  }
};

TEST_F(LibraryLogsTest, GrpcLinesTakeTheServersFormat) {
  gpr_log(GPR_ERROR, "Handshake failed with fatal error %s: \"%s\"",
          "SSL_ERROR_SSL", "wrong version number");
  const std::vector<std::string> got = TakeLines();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rfind("{\"time\":\"", 0), 0u) << got[0];
  EXPECT_NE(got[0].find("\"level\":\"error\",\"source\":"
                        "\"library_logs_test.cc:"),
            std::string::npos)
      << got[0];
  EXPECT_NE(got[0].find("\"msg\":\"Handshake failed with fatal error "
                        "SSL_ERROR_SSL: \\\"wrong version number\\\"\"}\n"),
            std::string::npos)
      << got[0];
}

TEST_F(LibraryLogsTest, TheServersLevelApplies) {
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  gpr_log(GPR_INFO, "an info line");
  gpr_log(GPR_DEBUG, "a debug line");
  log::SetMinLevel(log::Level::kError);
  gpr_log(GPR_INFO, "dropped");
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
  const std::vector<std::string> got = TakeLines();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("\"level\":\"info\""), std::string::npos) << got[0];
  EXPECT_NE(got[0].find("an info line"), std::string::npos) << got[0];
}

TEST_F(LibraryLogsTest, AbseilInternalLinesToo) {
  ABSL_INTERNAL_LOG(WARNING, "an abseil warning");
  const std::vector<std::string> got = TakeLines();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("\"level\":\"warning\""), std::string::npos) << got[0];
  EXPECT_NE(got[0].find("\"msg\":\"an abseil warning\"}"), std::string::npos)
      << got[0];
}

}  // namespace
}  // namespace materializer::service
