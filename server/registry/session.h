#ifndef MATERIALIZER_SERVER_REGISTRY_SESSION_H_
#define MATERIALIZER_SERVER_REGISTRY_SESSION_H_

// Sessions: a client's lease on its handles. A session lives while its
// Attach stream is open. When the stream ends, however it ends, the session
// waits `grace` for the client to come back with its resume token; after
// that every handle bound to it is released.
//
//   SessionTable sessions(&registry, absl::Seconds(5));
//   SessionTable::Attached a = sessions.Open("alice", absl::Now());
//   // ... Materialize with session a.session_id binds handles to it:
//   RETURN_IF_ERROR(sessions.WithLiveSession("alice", a.session_id, [&] {
//     handle = registry.Create(spec_with_session);
//   }));
//   sessions.Detach(a.session_id, absl::Now());   // the stream ended
//   sessions.Reap(absl::Now() + absl::Seconds(6)); // handles released

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/registry/registry.h"

namespace materializer::registry {

// Told about sessions as they open and end (the server logs and counts
// them). Called without the table's lock, on the thread that caused the
// event: an Attach stream's, or the reaper's. Implementations are
// thread-safe.
class SessionObserver {
 public:
  struct SessionEnd {
    std::string session_id;
    std::string owner;
    // What ending it released (SessionRelease).
    std::vector<std::string> handles;
    uint64_t freed_bytes = 0;
    // From the end of its stream to the release (the grace period plus
    // the reaper's delay).
    absl::Duration since_detach;
    // How long releasing the handles took.
    absl::Duration cleanup;
  };

  virtual ~SessionObserver() = default;
  virtual void SessionOpened(absl::string_view owner,
                             absl::string_view session_id, bool resumed) = 0;
  virtual void SessionEnded(const SessionEnd& end) = 0;
};

// Thread-safe. The registry must outlive the table.
class SessionTable {
 public:
  struct Attached {
    std::string session_id;
    // Presented by a new Attach stream to take the session over within the
    // grace period.
    std::string resume_token;
    // Which attachment this is: a stream that ended after the session was
    // resumed elsewhere must not detach the newer stream.
    uint64_t generation = 0;
    bool resumed = false;
  };

  // `observer` (optional) must outlive the table.
  SessionTable(HandleRegistry* registry, absl::Duration grace,
               SessionObserver* observer = nullptr);

  SessionTable(const SessionTable&) = delete;
  SessionTable& operator=(const SessionTable&) = delete;

  absl::Duration grace() const { return grace_; }

  // A new attached session owned by `owner`.
  Attached Open(absl::string_view owner, absl::Time now);

  // Re-attaches a detached session of `owner` by its resume token.
  // NOT_FOUND if the token is unknown, expired, or another client's;
  // ALREADY_EXISTS if the session is attached to another stream now.
  absl::StatusOr<Attached> Resume(absl::string_view owner,
                                  absl::string_view resume_token,
                                  absl::Time now);

  // The stream of attachment `generation` ended. With a zero grace period
  // the session's handles are released before this returns; otherwise at
  // the first Reap after now + grace unless it is resumed first. A stale
  // generation (the session was resumed on another stream) changes nothing.
  void Detach(absl::string_view session_id, uint64_t generation,
              absl::Time now);

  // Runs `bind` (which registers a handle bound to the session) only if
  // `session_id` is a live session of `owner`, and keeps the session from
  // ending while `bind` runs, so no handle can be bound to a session that
  // has already been reaped. NOT_FOUND for an unknown, ended or foreign
  // session.
  absl::Status WithLiveSession(absl::string_view owner,
                               absl::string_view session_id,
                               const std::function<void()>& bind);

  // Ends sessions detached for longer than the grace period, releasing
  // their handles. Returns how many sessions ended.
  int Reap(absl::Time now);

  // Live (attached or in grace) sessions, in all and of one owner.
  size_t size() const;
  size_t CountFor(absl::string_view owner) const;

 private:
  struct Session {
    std::string owner;
    std::string resume_token;
    bool attached = true;
    absl::Time detached_at;
    uint64_t generation = 0;
  };

  absl::StatusOr<Attached> ResumeUnobserved(absl::string_view owner,
                                        absl::string_view resume_token,
                                        absl::Time now);

  // Removes the session (mu_ held); Release() then frees its handles.
  void EndLocked(const std::string& session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Ending {
    std::string session_id;
    std::string owner;
    absl::Time detached_at;
  };
  // Releases an ended session's handles (mu_ not held) and tells the
  // observer.
  void Release(const Ending& ending, absl::Time now);

  HandleRegistry* const registry_;
  const absl::Duration grace_;
  SessionObserver* const observer_;

  mutable absl::Mutex mu_;
  // Guards sessions_ and by_token_. Held while binding a handle (see
  // WithLiveSession); lock order: mu_, then the registry's.
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> by_token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace materializer::registry

#endif  // MATERIALIZER_SERVER_REGISTRY_SESSION_H_
