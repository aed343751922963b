#ifndef MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_
#define MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_

// The HTTP endpoint Prometheus scrapes: GET /metrics on its own address
// (--metrics_listen), apart from the gRPC port.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> http,
//                    MetricsServer::Start("127.0.0.1:0", &metrics));
//   ... http->port() ...
//
// A deliberately small HTTP/1.1 server: one thread, one request per
// connection (Connection: close), a 5 s limit on reading a request and
// on writing the answer, request heads of at most 8 KiB; enough for
// Prometheus and curl. (prometheus-cpp's own endpoint cannot start its
// threads in this process: third_party/prometheus.BUILD says why.)
//
// The metrics name every client holding memory; serve them where only
// monitoring can reach (docs/operations.md).

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics/metrics.h"

namespace materializer::metrics {

// Thread-safe. Stops serving (and joins its thread) when destroyed.
class MetricsServer {
 public:
  // `address` is host:port (an IPv6 host in brackets); port 0 picks a free
  // one. INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it
  // cannot be bound. `metrics` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, const Metrics* metrics);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // host:port with the bound port, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Serve();
  void Answer(int connection) const;

  const Metrics* metrics_ = nullptr;
  int listen_fd_ = -1;
  // Written by the destructor to stop Serve().
  int wake_fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::thread thread_;
};

}  // namespace materializer::metrics

#endif  // MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_
