#include "server/metrics/session_reporter.h"

#include "server/common/log.h"

namespace materializer::metrics {

void SessionReporter::SessionOpened(absl::string_view owner,
                                    absl::string_view session_id,
                                    bool resumed) {
  if (metrics_ != nullptr) metrics_->RecordSessionOpened(resumed);
}

void SessionReporter::SessionEnded(const SessionEnd& end) {
  if (metrics_ != nullptr) {
    metrics_->RecordSessionEnded(end.cleanup, end.since_detach,
                                 end.handles.size());
  }
  MLOG_EVENT(INFO, "session_end")
      .Str("session", end.session_id)
      .Str("client", end.owner)
      .List("handles", end.handles)
      .Uint("freed_bytes", end.freed_bytes)
      .Millis("since_detach_ms", end.since_detach)
      .Millis("cleanup_ms", end.cleanup);
}

}  // namespace materializer::metrics
