#include "server/registry/handle.h"

#include <utility>

namespace materializer::registry {

Handle::Handle(std::string id, absl::Time created, HandleSpec spec)
    : id_(std::move(id)), created_(created), spec_(std::move(spec)) {
  absl::MutexLock lock(&mu_);
  lease_expiry_ = spec_.ttl == absl::InfiniteDuration()
                      ? absl::InfiniteFuture()
                      : created_ + spec_.ttl;
}

absl::Time Handle::Renew(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (spec_.ttl != absl::InfiniteDuration()) lease_expiry_ = now + spec_.ttl;
  return lease_expiry_;
}

absl::Time Handle::lease_expiry() const {
  absl::MutexLock lock(&mu_);
  return lease_expiry_;
}

v1::HandleState Handle::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

std::string Handle::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

std::shared_ptr<const memory::Arena> Handle::arena() const {
  absl::MutexLock lock(&mu_);
  return arena_;
}

void Handle::MarkReady(std::shared_ptr<memory::Arena> arena) {
  std::shared_ptr<const memory::Arena> dropped;
  absl::MutexLock lock(&mu_);
  state_ = v1::HANDLE_STATE_READY;
  if (released_) {
    dropped = std::move(arena);  // freed after the lock is released
  } else {
    arena_ = std::move(arena);
  }
}

void Handle::MarkFailed(std::string error) {
  absl::MutexLock lock(&mu_);
  state_ = v1::HANDLE_STATE_FAILED;
  error_ = std::move(error);
}

uint64_t Handle::Release() {
  std::shared_ptr<const memory::Arena> dropped;
  absl::MutexLock lock(&mu_);
  if (released_) return 0;
  released_ = true;
  // A handle still materializing gives back its bytes when the worker
  // finishes (MarkReady drops the arena); report them now.
  const uint64_t bytes =
      state_ == v1::HANDLE_STATE_MATERIALIZING ? spec_.layout.arena_bytes
      : arena_ != nullptr                      ? arena_->bytes()
                                               : 0;
  dropped = std::move(arena_);
  return bytes;
}

}  // namespace materializer::registry
