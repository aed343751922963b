#ifndef MATERIALIZER_SERVER_METRICS_METRICS_H_
#define MATERIALIZER_SERVER_METRICS_METRICS_H_

// The server's Prometheus metrics: one object, made by the server and
// handed to the parts that record into it (the service for RPCs and
// fetches, the engine for materializations and exports, the session
// observer, the reaper). Figures that the server already keeps (the
// ledger, handle states, the GPU driver's view) are not duplicated into
// counters: they are read from their owners at scrape time.
//
//   Metrics metrics({.pool = pool, .registry = registry, .gpu = reporter});
//   metrics.RecordRpc("Plan", absl::StatusCode::kOk, absl::Milliseconds(3));
//   std::string text = metrics.TextFormat();   // what /metrics serves
//   (metrics_server.h serves it over HTTP)
//
// docs/operations.md lists every metric with its labels. Recording is cheap
// (atomic adds; a histogram takes a short lock) and never blocks on a
// scrape. This header deliberately includes nothing from prometheus-cpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace materializer {
namespace memory {
class DevicePool;
class GpuReporter;
}  // namespace memory
namespace registry {
class HandleRegistry;
}  // namespace registry
namespace v1 {
class PhaseTimings;
}  // namespace v1

namespace metrics {

// Per-client series get their own `client` label for this many clients
// (those holding the most bytes); the rest are summed under "(other)".
inline constexpr int kDefaultClientLabels = 20;

// Where scrape-time figures come from. Each may be null (then its metrics
// are absent); each must outlive the Metrics.
// The checkpoint cache's figures (server/load/range_cache.h), as a scrape
// reads them.
struct CheckpointCacheFigures {
  uint64_t capacity_bytes = 0;
  uint64_t cached_bytes = 0;
  uint64_t read_bytes = 0;
  uint64_t served_bytes = 0;
  uint64_t evicted_bytes = 0;
};

struct ShmPoolFigures {
  uint64_t target_bytes = 0;  // what the refill works toward now
  uint64_t max_bytes = 0;     // the most it may keep
  uint64_t bytes = 0;
  uint64_t taken_bytes = 0;
  uint64_t filled_bytes = 0;
  uint64_t trimmed_bytes = 0;
};

struct StateSources {
  const memory::DevicePool* pool = nullptr;
  const registry::HandleRegistry* registry = nullptr;
  const memory::GpuReporter* gpu = nullptr;
  int client_labels = kDefaultClientLabels;
  // Called at each scrape; null: the server reads no checkpoints.
  std::function<CheckpointCacheFigures()> checkpoint_cache;
  // Called at each scrape; null: no shared-memory pool.
  std::function<ShmPoolFigures()> shm_pool;
};

// Thread-safe.
class Metrics {
 public:
  explicit Metrics(StateSources sources = StateSources());
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // One finished RPC: `method` is the bare method name ("Plan").
  void RecordRpc(absl::string_view method, absl::StatusCode code,
                 absl::Duration latency);

  // One finished materialization (sync or async): its phase timings, its
  // RNG mode ("portable", "torch") and the tensor bytes it initialized.
  void RecordMaterialize(const v1::PhaseTimings& timings,
                         absl::string_view rng, uint64_t tensor_bytes);

  // A fetch stream opened (at offset 0, or resumed at a later offset), and
  // its bytes as they are sent.
  void RecordFetchStart(bool resumed);
  void AddFetchBytes(uint64_t bytes);

  // An export opened ("shared_memory" or "cuda_ipc") or closed.
  void RecordExportOpened(absl::string_view kind);
  void RecordExportClosed();

  // Sessions: opened (or resumed), and ended after their grace period,
  // with how long releasing their handles took and how long after the
  // stream ended that was done.
  void RecordSessionOpened(bool resumed);
  void RecordSessionEnded(absl::Duration cleanup, absl::Duration since_detach,
                          size_t handles);

  // The reaper released `handles` handles whose lease lapsed, in `cleanup`.
  void RecordLeaseExpiry(absl::Duration cleanup, size_t handles);

  // A changed credential file was put in force (`ok`), or refused, the old
  // one staying in force. `kind` is "tokens", "certificate" (with its
  // key) or "client_ca"; the series of these three exist from the start.
  void RecordCredentialReload(absl::string_view kind, bool ok);

  // Every metric in the Prometheus text format, as a scrape sees it.
  std::string TextFormat() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metrics
}  // namespace materializer

#endif  // MATERIALIZER_SERVER_METRICS_METRICS_H_
