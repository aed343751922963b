#ifndef MATERIALIZER_SERVER_METRICS_CLIENT_SERIES_H_
#define MATERIALIZER_SERVER_METRICS_CLIENT_SERIES_H_

// Per-client metrics with a bounded number of series. Client names come
// from authentication, so a server with many (or churning) clients would
// otherwise create a time series per name forever, which Prometheus
// handles badly. The bound: the `limit` clients holding the most bytes
// right now keep their names; everyone else is summed into one series
// labelled kOtherClients. At most limit + 1 series per metric exist at any
// scrape, and the heavy holders, the ones an operator asks about, are
// always named.

#include <cstdint>
#include <string>
#include <vector>

namespace materializer::metrics {

// Not a valid client name (docs/operations.md: names are
// [A-Za-z0-9._@:+-]), so it cannot be confused with one.
inline constexpr char kOtherClients[] = "(other)";

struct ClientFigures {
  std::string client;
  uint64_t reserved_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint32_t handles = 0;
};

// The series to export: the `limit` clients with the most reserved +
// in-use bytes (ties: by name) in that order, then, if any are left, one
// kOtherClients entry with their sums. limit <= 0 sums everyone.
std::vector<ClientFigures> BoundClientSeries(std::vector<ClientFigures> clients,
                                             int limit);

}  // namespace materializer::metrics

#endif  // MATERIALIZER_SERVER_METRICS_CLIENT_SERIES_H_
