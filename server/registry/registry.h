#ifndef MATERIALIZER_SERVER_REGISTRY_REGISTRY_H_
#define MATERIALIZER_SERVER_REGISTRY_REGISTRY_H_

// Handles by id, each owned by one authenticated identity. To any other
// identity a handle does not exist: lookups answer NOT_FOUND exactly as for
// an id that was never issued, so ids cannot be probed.
//
//   std::shared_ptr<Handle> h = registry.Create(std::move(spec));
//   ASSIGN_OR_RETURN(std::shared_ptr<Handle> same, registry.Get(owner, id));

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/registry/handle.h"
#include "server/registry/handle_id.h"

namespace materializer::registry {

struct ReleaseResult {
  // False when the owner had already released this handle.
  bool released = false;
  uint64_t freed_bytes = 0;
};

// What ending a session released.
struct SessionRelease {
  std::vector<std::string> handles;  // ids, sorted
  uint64_t freed_bytes = 0;
};

// Registered handles by state, and their open exports.
struct RegistryCensus {
  size_t materializing = 0;
  size_t ready = 0;
  size_t failed = 0;
  // Open exports, including those of force-released handles still
  // draining.
  size_t exports = 0;
};

// Thread-safe.
class HandleRegistry {
 public:
  // How many released ids are remembered (per registry) so that a repeated
  // Release can say "already released" instead of NOT_FOUND.
  static constexpr size_t kReleasedMemory = 100000;

  // Ids of handles created here name `replica` (handle_id.h); "" for a
  // single server.
  explicit HandleRegistry(std::string replica = "")
      : replica_(std::move(replica)) {}
  HandleRegistry(const HandleRegistry&) = delete;
  HandleRegistry& operator=(const HandleRegistry&) = delete;

  // Registers a new handle (state MATERIALIZING) under a fresh id.
  std::shared_ptr<Handle> Create(HandleSpec spec);

  // The handle if `owner` owns it, else NOT_FOUND. Renews its lease (use
  // by the owner keeps a handle alive).
  absl::StatusOr<std::shared_ptr<Handle>> Get(absl::string_view owner,
                                              absl::string_view id) const;

  // Unregisters and releases the handle. Idempotent for its owner;
  // NOT_FOUND for anyone else and for ids never issued. While the handle is
  // exported: FAILED_PRECONDITION (nothing changes) unless `force`; a
  // forced release keeps the handle reachable by GetExported until its
  // last export is closed.
  absl::StatusOr<ReleaseResult> Release(absl::string_view owner,
                                        absl::string_view id,
                                        bool force = false);

  // The handle for export bookkeeping: a registered one, or one released
  // with force whose exports are not all closed yet. NOT_FOUND otherwise
  // (and for other owners).
  absl::StatusOr<std::shared_ptr<Handle>> GetExported(
      absl::string_view owner, absl::string_view id) const;

  // Call after closing an export of `id`: forgets a force-released handle
  // whose last export is gone.
  void ExportClosed(absl::string_view id);

  // Unregisters without reporting (rollback of a failed materialization).
  void Forget(absl::string_view id);

  // Releases every handle bound to `session` (the session ended), with
  // force: exported ones too. Returns their ids and the bytes freed.
  SessionRelease ReleaseSession(absl::string_view session);

  // Releases every handle whose lease expired at or before `now`, except
  // exported ones (an importer is using them; they expire once their last
  // export is closed and the lease runs out). Returns their ids.
  std::vector<std::string> ReleaseExpired(absl::Time now);

  // `owner`'s handles, oldest first.
  std::vector<std::shared_ptr<Handle>> List(absl::string_view owner) const;

  size_t size() const;

  // Counts for monitoring (a pass over every handle).
  RegistryCensus Census() const;

 private:
  const std::string replica_;

  mutable absl::Mutex mu_;
  // Guards every member below.
  absl::flat_hash_map<std::string, std::shared_ptr<Handle>> handles_
      ABSL_GUARDED_BY(mu_);
  // Released id -> owner, bounded FIFO.
  absl::flat_hash_map<std::string, std::string> released_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> released_order_ ABSL_GUARDED_BY(mu_);
  // Released with force while exported, until the last export closes.
  absl::flat_hash_map<std::string, std::shared_ptr<Handle>> draining_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace materializer::registry

#endif  // MATERIALIZER_SERVER_REGISTRY_REGISTRY_H_
