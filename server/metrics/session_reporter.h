#ifndef MATERIALIZER_SERVER_METRICS_SESSION_REPORTER_H_
#define MATERIALIZER_SERVER_METRICS_SESSION_REPORTER_H_

// Sessions as operators see them: counted in the metrics, and each end
// logged as one structured line that lists the handles it released:
//
//   session_end session=s-... client=alice handles=h-...,h-...
//     freed_bytes=1048576 since_detach_ms=5104.2 cleanup_ms=0.8

#include "server/metrics/metrics.h"
#include "server/registry/session.h"

namespace materializer::metrics {

// Thread-safe. `metrics` (may be null) must outlive it.
class SessionReporter final : public registry::SessionObserver {
 public:
  explicit SessionReporter(Metrics* metrics) : metrics_(metrics) {}

  void SessionOpened(absl::string_view owner, absl::string_view session_id,
                     bool resumed) override;
  void SessionEnded(const SessionEnd& end) override;

 private:
  Metrics* const metrics_;
};

}  // namespace materializer::metrics

#endif  // MATERIALIZER_SERVER_METRICS_SESSION_REPORTER_H_
