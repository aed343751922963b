#include "server/service/credential_watcher.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/log.h"
#include "server/metrics/metrics.h"

namespace materializer::service {

CredentialWatcher::CredentialWatcher(std::vector<CredentialSource> sources,
                                     absl::Duration interval,
                                     metrics::Metrics* metrics)
    : metrics_(metrics) {
  {
    absl::MutexLock lock(&apply_mu_);
    for (CredentialSource& source : sources) {
      states_.push_back(State{std::move(source), std::nullopt, std::nullopt});
    }
  }
  if (interval > absl::ZeroDuration()) {
    thread_ = std::thread([this, interval] { Loop(interval); });
  }
}

CredentialWatcher::~CredentialWatcher() { Stop(); }

void CredentialWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CredentialWatcher::Loop(absl::Duration interval) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
    }
    PollOnce();
  }
}

CredentialWatcher::Reading CredentialWatcher::Read(
    const CredentialSource& source) {
  Reading reading;
  for (const std::string& path : source.paths) {
    std::ifstream file(path, std::ios::binary);
    std::stringstream text;
    if (file) text << file.rdbuf();
    if (!file || file.bad()) {
      reading.status = absl::NotFoundError(absl::StrCat("cannot read ", path));
      reading.contents.clear();
      return reading;
    }
    reading.contents.push_back(text.str());
  }
  return reading;
}

void CredentialWatcher::PollOnce() {
  absl::MutexLock lock(&apply_mu_);
  for (State& state : states_) {
    const Reading reading = Read(state.source);
    if (reading.status.ok() && reading.contents == state.source.in_force) {
      state.pending.reset();
      continue;
    }
    if (state.refused.has_value() && *state.refused == reading) continue;
    // Changed: wait until a second read agrees.
    if (!state.pending.has_value() || !(*state.pending == reading)) {
      state.pending = reading;
      continue;
    }
    Apply(state, reading).IgnoreError();  // reported
  }
}

absl::Status CredentialWatcher::ReloadNow() {
  absl::MutexLock lock(&apply_mu_);
  absl::Status first;
  for (State& state : states_) {
    const Reading reading = Read(state.source);
    if (reading.status.ok() && reading.contents == state.source.in_force) {
      state.pending.reset();
      MLOG_EVENT(INFO, "credential_reload")
          .Str("kind", state.source.kind)
          .Str("files", absl::StrJoin(state.source.paths, ","))
          .Str("result", "unchanged");
      continue;
    }
    absl::Status status = Apply(state, reading);
    if (first.ok()) first = std::move(status);
  }
  return first;
}

absl::Status CredentialWatcher::Apply(State& state, const Reading& reading) {
  state.pending.reset();
  absl::StatusOr<std::string> outcome =
      reading.status.ok() ? state.source.apply(reading.contents)
                          : absl::StatusOr<std::string>(reading.status);
  if (outcome.ok()) {
    state.source.in_force = reading.contents;
    state.refused.reset();
  } else {
    state.refused = reading;
  }
  Report(state, outcome);
  return outcome.status();
}

void CredentialWatcher::Report(const State& state,
                               const absl::StatusOr<std::string>& outcome) {
  const std::string files = absl::StrJoin(state.source.paths, ",");
  if (metrics_ != nullptr) {
    metrics_->RecordCredentialReload(state.source.kind, outcome.ok());
  }
  if (outcome.ok()) {
    MLOG_EVENT(INFO, "credential_reload")
        .Str("kind", state.source.kind)
        .Str("files", files)
        .Str("result", "ok")
        .Str("detail", *outcome);
  } else {
    MLOG_EVENT(ERROR, "credential_reload")
        .Str("kind", state.source.kind)
        .Str("files", files)
        .Str("result", "error")
        .Str("error", absl::StrCat(outcome.status().message(),
                                   "; the credentials in force stay"));
  }
}

}  // namespace materializer::service
