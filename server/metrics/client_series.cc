#include "server/metrics/client_series.h"

#include <algorithm>
#include <utility>

namespace materializer::metrics {

std::vector<ClientFigures> BoundClientSeries(std::vector<ClientFigures> clients,
                                             int limit) {
  auto bytes = [](const ClientFigures& c) {
    return c.reserved_bytes + c.in_use_bytes;
  };
  std::sort(clients.begin(), clients.end(),
            [&](const ClientFigures& a, const ClientFigures& b) {
              if (bytes(a) != bytes(b)) return bytes(a) > bytes(b);
              return a.client < b.client;
            });
  const size_t keep = limit <= 0 ? 0 : static_cast<size_t>(limit);
  if (clients.size() <= keep) return clients;
  ClientFigures other;
  other.client = kOtherClients;
  for (size_t i = keep; i < clients.size(); ++i) {
    other.reserved_bytes += clients[i].reserved_bytes;
    other.in_use_bytes += clients[i].in_use_bytes;
    other.handles += clients[i].handles;
  }
  clients.resize(keep);
  clients.push_back(std::move(other));
  return clients;
}

}  // namespace materializer::metrics
