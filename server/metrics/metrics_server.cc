#include "server/metrics/metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace materializer::metrics {
namespace {

constexpr size_t kMaxRequestHead = 8 << 10;
constexpr int kIoTimeoutSeconds = 5;

// Splits "host:port" / "[v6]:port".
bool SplitAddress(const std::string& address, std::string* host,
                  std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      colon + 1 == address.size()) {
    return false;
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->front() == '[') {
    if (host->size() < 3 || host->back() != ']') return false;
    *host = host->substr(1, host->size() - 2);
  }
  for (char c : *port) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void Respond(int fd, const char* status, absl::string_view content_type,
             absl::string_view body) {
  WriteAll(fd, absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ",
                            content_type, "\r\nContent-Length: ", body.size(),
                            "\r\nConnection: close\r\n\r\n"));
  WriteAll(fd, body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const Metrics* metrics) {
  std::string host;
  std::string port;
  if (!SplitAddress(address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", address, "\" is not host:port"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      error != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", address, "\": ", gai_strerror(error)));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->metrics_ = metrics;
  int last_errno = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 16) == 0) {
      server->listen_fd_ = fd;
      break;
    }
    last_errno = errno;
    close(fd);
  }
  freeaddrinfo(found);
  if (server->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", std::strerror(last_errno)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&bound),
              &length);
  server->port_ =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  server->address_ = absl::StrCat(address.substr(0, address.rfind(':')), ":",
                                  server->port_);
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  server->thread_ = std::thread([raw = server.get()] { raw->Serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // shutting down
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void MetricsServer::Answer(int connection) const {
  // A client that stalls costs at most the timeout.
  timeval timeout{kIoTimeoutSeconds, 0};
  setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string head;
  char buffer[1024];
  while (head.find("\r\n\r\n") == std::string::npos) {
    if (head.size() > kMaxRequestHead) {
      Respond(connection, "431 Request Header Fields Too Large", "text/plain",
              "request head too large\n");
      return;
    }
    const ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or too slow
    head.append(buffer, static_cast<size_t>(n));
  }
  const absl::string_view line =
      absl::string_view(head).substr(0, head.find("\r\n"));
  const bool get = absl::StartsWith(line, "GET ");
  const bool path_ok = absl::StartsWith(line, "GET /metrics ") ||
                       absl::StartsWith(line, "GET /metrics?");
  if (!get) {
    Respond(connection, "405 Method Not Allowed", "text/plain",
            "only GET /metrics\n");
  } else if (!path_ok) {
    Respond(connection, "404 Not Found", "text/plain",
            "metrics are at /metrics\n");
  } else {
    Respond(connection, "200 OK", "text/plain; version=0.0.4; charset=utf-8",
            metrics_->TextFormat());
  }
}

}  // namespace materializer::metrics
