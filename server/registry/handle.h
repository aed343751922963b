#ifndef MATERIALIZER_SERVER_REGISTRY_HANDLE_H_
#define MATERIALIZER_SERVER_REGISTRY_HANDLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
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
  // Pool device name ("cpu", "cuda:0").
  std::string device;
  std::vector<spec::TensorDesc> tensors;
  // Which init filled each tensor, e.g. "normal(mean=0, std=0.02) [rule 1]".
  std::vector<std::string> init_descriptions;
  spec::Layout layout;
  uint64_t seed = 0;
  v1::RngMode rng = v1::RNG_MODE_UNSPECIFIED;
  // The session the handle is bound to ("" = none): it is released when the
  // session ends.
  std::string session;
  // Lease of a handle outside a session: released when unused for this long
  // (every lookup by its owner renews it). InfiniteDuration = no lease.
  absl::Duration ttl = absl::InfiniteDuration();
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
  // held none or was already released).
  uint64_t Release();

  // Lease: Renew moves the expiry to now + ttl; a handle without a TTL
  // never expires.
  absl::Time Renew(absl::Time now);
  absl::Time lease_expiry() const;

 private:
  const std::string id_;
  const absl::Time created_;
  const HandleSpec spec_;

  mutable absl::Mutex mu_;
  // Guards state_, error_, arena_, released_, lease_expiry_.
  v1::HandleState state_ ABSL_GUARDED_BY(mu_) =
      v1::HANDLE_STATE_MATERIALIZING;
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const memory::Arena> arena_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time lease_expiry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace materializer::registry

#endif  // MATERIALIZER_SERVER_REGISTRY_HANDLE_H_
