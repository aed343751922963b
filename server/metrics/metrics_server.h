#ifndef MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_
#define MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_

// The HTTP endpoint Prometheus scrapes: GET /metrics on its own address
// (--metrics_listen), apart from the gRPC port, served by prometheus-cpp's
// embedded web server on two threads of its own.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> http,
//                    MetricsServer::Start("127.0.0.1:0", &metrics));
//   ... http->port() ...
//
// The metrics name every client holding memory; serve them where only
// monitoring can reach (docs/operations.md).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace materializer::metrics {

// Thread-safe. Stops serving when destroyed. `metrics` may be destroyed
// first (a scrape then returns nothing), but normally outlives it.
class MetricsServer {
 public:
  // `address` is host:port; port 0 picks a free one. UNAVAILABLE when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, const Metrics& metrics);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // host:port with the bound port, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
};

}  // namespace materializer::metrics

#endif  // MATERIALIZER_SERVER_METRICS_METRICS_SERVER_H_
