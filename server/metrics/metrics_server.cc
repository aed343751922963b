#include "server/metrics/metrics_server.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace materializer::metrics {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const Metrics& metrics) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", address, "\" is not host:port"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address, ": ", e.what(),
        " (address in use, or not an address of this host)"));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address));
  }
  server->port_ = ports.front();
  server->address_ = absl::StrCat(address.substr(0, colon), ":", ports.front());
  server->exposer_->RegisterCollectable(metrics.collectable());
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace materializer::metrics
