#ifndef MATERIALIZER_SERVER_REGISTRY_HANDLE_H_
#define MATERIALIZER_SERVER_REGISTRY_HANDLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "materializer/v1/materializer.pb.h"
#include "server/memory/arena.h"
#include "server/spec/layout.h"
#include "server/spec/tensor_desc.h"

namespace materializer::registry {

// What a handle is, fixed when it is created.
struct HandleSpec {
  std::string owner;
  std::string label;
  // Pool device name ("cpu", "cuda:0"); for a handle split across devices
  // their names joined with '+' ("cuda:0+cuda:1").
  std::string device;
  // Split handles: each tensor's device (empty otherwise).
  std::vector<std::string> tensor_devices;
  std::vector<spec::TensorDesc> tensors;
  // Which init filled each tensor, e.g. "normal(mean=0, std=0.02) [rule 1]".
  std::vector<std::string> init_descriptions;
  // Each tensor's init steps (TensorInfo.steps; none for a tied tensor).
  std::vector<std::vector<v1::InitStepInfo>> init_steps;
  spec::Layout layout;
  uint64_t seed = 0;
  v1::RngMode rng = v1::RNG_MODE_UNSPECIFIED;
  // The session the handle is bound to ("" = none): it is released when the
  // session ends.
  std::string session;
  // Lease of a handle outside a session: released when unused for this long
  // (every lookup by its owner renews it). InfiniteDuration = no lease.
  absl::Duration ttl = absl::InfiniteDuration();
  // MaterializeRequest.exportable: a CPU arena in shared memory.
  bool exportable = false;
};

// One live ExportHandle of a handle.
struct ExportRecord {
  std::string id;
  // CUDA exports hold the arena: an importer's IPC mapping must never see
  // the memory reused, so the allocation lives until CloseExport, even
  // after a forced release. CPU exports hold nothing (the importer's
  // mapping of the shared-memory file keeps its pages).
  std::shared_ptr<const memory::Arena> arena;
  absl::Time opened;
};

// A registered materialization. Its tensors are meta (shape and dtype only)
// until the arena is attached by MarkReady.
//
// Thread-safe: the spec is immutable; the state is guarded by mu_.
// Shared by the registry, the worker that materializes it, and fetches in
// flight; its memory goes when the last of them lets go of the arena.
class Handle {
 public:
  Handle(std::string id, absl::Time created, HandleSpec spec);

  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  const std::string& id() const { return id_; }
  absl::Time created() const { return created_; }
  const HandleSpec& spec() const { return spec_; }

  v1::HandleState state() const;
  // Why materialization failed (state FAILED), else "".
  std::string error() const;
  // The storage, or nullptr while MATERIALIZING, after FAILED, or once
  // released.
  std::shared_ptr<const memory::Arena> arena() const;

  // MATERIALIZING -> READY with the initialized arena. If the handle was
  // released meanwhile, the arena is dropped at once (and so freed).
  void MarkReady(std::shared_ptr<memory::Arena> arena);
  // MATERIALIZING -> FAILED.
  void MarkFailed(std::string error);
  // Drops the arena reference; returns the bytes this released (0 if it
  // held none or was already released). Same as BeginRelease(true) then
  // FinishRelease().
  uint64_t Release();

  // Release in two steps, so the registry can refuse it before it
  // unregisters the handle. BeginRelease marks the handle released
  // (no new exports or fetches); it is FAILED_PRECONDITION while the handle
  // is exported, unless `force`. FinishRelease unlinks a shared-memory
  // arena's file and drops the arena reference (a fetch in flight keeps
  // the bytes until it ends); it returns the bytes released.
  absl::Status BeginRelease(bool force);
  uint64_t FinishRelease();
  bool released() const;

  // Exports (ExportHandle). AddExport is FAILED_PRECONDITION once the
  // handle is released; CloseExport NOT_FOUND for an unknown id. Both
  // return the number of live exports after the call.
  absl::StatusOr<uint32_t> AddExport(ExportRecord record);
  absl::StatusOr<uint32_t> CloseExport(absl::string_view export_id);
  uint32_t num_exports() const;

  // Values derived from the bytes, which never change once READY: each is
  // computed by `compute` the first time it is asked for and cached.
  // Concurrent first callers wait for one computation.
  //   Per-tensor digests ("xxh3-128:..."), in spec order (tied tensors
  //   repeat their root's).
  using Digests = std::vector<std::string>;
  absl::StatusOr<std::shared_ptr<const Digests>> TensorDigests(
      const std::function<absl::StatusOr<Digests>()>& compute) const;
  //   CRC-32 of each tensor's bytes (for zip archives), in spec order.
  using Crcs = std::vector<uint32_t>;
  absl::StatusOr<std::shared_ptr<const Crcs>> TensorCrcs(
      const std::function<absl::StatusOr<Crcs>()>& compute) const;
  //   Shard-composable fingerprints (delivery/fingerprint.h), spec order.
  using Fingerprints = std::vector<uint64_t>;
  absl::StatusOr<std::shared_ptr<const Fingerprints>> TensorFingerprints(
      const std::function<absl::StatusOr<Fingerprints>()>& compute) const;
  //   Whole-file digests by file key (format, filters, flags); set by the
  //   first fetch or DescribeFile that computes one.
  std::string FileDigest(const std::string& key) const;
  void SetFileDigest(const std::string& key, const std::string& digest) const;

  // Lease: Renew moves the expiry to now + ttl; a handle without a TTL
  // never expires.
  absl::Time Renew(absl::Time now);
  absl::Time lease_expiry() const;

 private:
  const std::string id_;
  const absl::Time created_;
  const HandleSpec spec_;

  mutable absl::Mutex mu_;
  // Guards state_, error_, arena_, released_, lease_expiry_, exports_,
  // file_digests_.
  v1::HandleState state_ ABSL_GUARDED_BY(mu_) = v1::HANDLE_STATE_MATERIALIZING;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const memory::Arena> arena_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time lease_expiry_ ABSL_GUARDED_BY(mu_);
  std::vector<ExportRecord> exports_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::string, std::string> file_digests_
      ABSL_GUARDED_BY(mu_);

  // Held while a derived value is computed (seconds for gigabytes), so
  // that concurrent first callers compute it once. Guards the two caches
  // below. Lock order: compute_mu_, then mu_.
  mutable absl::Mutex compute_mu_;
  mutable std::shared_ptr<const Digests> tensor_digests_
      ABSL_GUARDED_BY(compute_mu_);
  mutable std::shared_ptr<const Crcs> tensor_crcs_ ABSL_GUARDED_BY(compute_mu_);
  mutable std::shared_ptr<const Fingerprints> tensor_fingerprints_
      ABSL_GUARDED_BY(compute_mu_);
};

}  // namespace materializer::registry

#endif  // MATERIALIZER_SERVER_REGISTRY_HANDLE_H_
