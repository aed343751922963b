#ifndef MATERIALIZER_SERVER_SERVICE_CREDENTIAL_WATCHER_H_
#define MATERIALIZER_SERVER_SERVICE_CREDENTIAL_WATCHER_H_

// Keeps the server's credential files in force while it runs: the token
// file, the certificate with its key, the client CA. Each is read every
// `interval` and, on request (SIGHUP), at once; contents that differ from
// those in force are handed to their owner (the Authenticator), which
// checks them and swaps them in, or refuses them and keeps the old ones.
// Every outcome is logged (event `credential_reload`) and counted
// (materializer_credential_reloads_total{kind,result}).
//
// A change found by polling is applied once the files read the same at two
// polls in a row, so a file caught half written, or a certificate whose
// key has not been copied yet, is not taken for a bad one. Refused
// contents are reported once, not at every poll; a reload on request
// reports them again.
//
//   CredentialWatcher watcher(authenticator->CredentialSources(),
//                             absl::Seconds(1), metrics);
//   ... on SIGHUP: watcher.ReloadNow();
//   watcher.Stop();  // or destroy it
//
// Thread-safe.

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace materializer {
namespace metrics {
class Metrics;
}  // namespace metrics

namespace service {

// One credential made of files read together.
struct CredentialSource {
  // The metrics label and log field: "tokens", "certificate", "client_ca".
  std::string kind;
  // The files, read in this order.
  std::vector<std::string> paths;
  // The contents in force now (one per path), as the owner loaded them.
  std::vector<std::string> in_force;
  // Checks `contents` (one per path) and puts them in force, returning a
  // line for the log ("3 tokens"); or refuses them, changing nothing.
  // Called from one thread at a time.
  std::function<absl::StatusOr<std::string>(
      const std::vector<std::string>& contents)>
      apply;
};

class CredentialWatcher {
 public:
  // Polls every `interval` on a thread of its own; a zero interval polls
  // never (reloads happen on request only). `metrics` may be null; it must
  // outlive the watcher.
  CredentialWatcher(std::vector<CredentialSource> sources,
                    absl::Duration interval, metrics::Metrics* metrics);
  ~CredentialWatcher();
  CredentialWatcher(const CredentialWatcher&) = delete;
  CredentialWatcher& operator=(const CredentialWatcher&) = delete;

  // Reads every file now and applies whatever differs from what is in
  // force, stable or not. Returns once done; OK, or the first refusal.
  absl::Status ReloadNow();

  // One poll, as the thread does it (for tests that drive time
  // themselves).
  void PollOnce();

  // Ends the polling thread. Idempotent.
  void Stop();

 private:
  // What one read of a source's files gave: their contents, or why they
  // could not be read.
  struct Reading {
    absl::Status status;
    std::vector<std::string> contents;
    bool operator==(const Reading& other) const {
      return status == other.status && contents == other.contents;
    }
  };
  struct State {
    CredentialSource source;
    // Last refused (reported once), and last seen but not yet stable.
    std::optional<Reading> refused;
    std::optional<Reading> pending;
  };

  static Reading Read(const CredentialSource& source);
  // Puts `reading` in force or refuses it, and reports the outcome.
  absl::Status Apply(State& state, const Reading& reading)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  void Report(const State& state, const absl::StatusOr<std::string>& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  void Loop(absl::Duration interval);

  metrics::Metrics* const metrics_;

  absl::Mutex apply_mu_;
  // Guards the sources' state: one poll or reload at a time.
  std::vector<State> states_ ABSL_GUARDED_BY(apply_mu_);

  absl::Mutex mu_;
  // Guards the thread's stop flag.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace service
}  // namespace materializer

#endif  // MATERIALIZER_SERVER_SERVICE_CREDENTIAL_WATCHER_H_
