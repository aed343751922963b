#include "server/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::metrics {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and returns everything the server
// answers, or "" if it cannot connect.
std::string Exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)!write(fd, request.data(), request.size());
    char buffer[4096];
    ssize_t n;
    while ((n = read(fd, buffer, sizeof(buffer))) > 0) answer.append(buffer, n);
  }
  close(fd);
  return answer;
}

TEST(MetricsServerTest, ServesTheTextFormatAtSlashMetrics) {
  Metrics metrics;
  metrics.RecordRpc("Plan", absl::StatusCode::kOk, absl::Milliseconds(1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsServer> server,
                       MetricsServer::Start("127.0.0.1:0", &metrics));
  ASSERT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), absl::StrCat("127.0.0.1:", server->port()));

  const std::string ok = Exchange(
      server->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr(
      "\r\n\r\n# HELP materializer_rpcs_total"));
  EXPECT_THAT(ok, HasSubstr(
      "materializer_rpcs_total{code=\"OK\",method=\"Plan\"} 1\n"));
  const size_t body = ok.find("\r\n\r\n") + 4;
  EXPECT_THAT(ok, HasSubstr(absl::StrCat("Content-Length: ",
                                         ok.size() - body, "\r\n")));

  EXPECT_THAT(Exchange(server->port(), "GET / HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Exchange(server->port(), "POST /metrics HTTP/1.1\r\n\r\n"),
              StartsWith("HTTP/1.1 405 "));
  EXPECT_THAT(Exchange(server->port(),
                       "GET /metrics HTTP/1.1\r\n" + std::string(9000, 'x')),
              StartsWith("HTTP/1.1 431 "));
  // Still serving after all that.
  EXPECT_THAT(Exchange(server->port(), "GET /metrics HTTP/1.0\r\n\r\n"),
              StartsWith("HTTP/1.1 200 OK\r\n"));

  const int port = server->port();
  server.reset();
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "");
}

TEST(MetricsServerTest, BadAndBusyAddresses) {
  Metrics metrics;
  EXPECT_THAT(MetricsServer::Start("no-port", &metrics),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not host:port")));
  EXPECT_THAT(MetricsServer::Start("127.0.0.1:http", &metrics),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host:port")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsServer> first,
                       MetricsServer::Start("127.0.0.1:0", &metrics));
  EXPECT_THAT(
      MetricsServer::Start(absl::StrCat("127.0.0.1:", first->port()), &metrics),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("in use")));
}

}  // namespace
}  // namespace materializer::metrics
