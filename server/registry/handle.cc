#include "server/registry/handle.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"

namespace materializer::registry {

Handle::Handle(std::string id, absl::Time created, HandleSpec spec)
    : id_(std::move(id)), created_(created), spec_(std::move(spec)) {
  absl::MutexLock lock(&mu_);
  lease_expiry_ = spec_.ttl == absl::InfiniteDuration() ? absl::InfiniteFuture()
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
  if (!BeginRelease(/*force=*/true).ok()) return 0;  // already released
  return FinishRelease();
}

absl::Status Handle::BeginRelease(bool force) {
  absl::MutexLock lock(&mu_);
  if (released_) {
    return absl::FailedPreconditionError(
        absl::StrCat("handle ", id_, " is already released"));
  }
  if (!exports_.empty() && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", id_, " is exported (", exports_.size(),
        exports_.size() == 1 ? " live export" : " live exports", ", the first ",
        exports_.front().id,
        "): a co-located process may be using its memory. Close the "
        "export(s) with CloseExport when the importer is done, or release "
        "with force (importers' CPU mappings stay valid; CUDA memory stays "
        "allocated until each export is closed)"));
  }
  released_ = true;
  return absl::OkStatus();
}

uint64_t Handle::FinishRelease() {
  std::shared_ptr<const memory::Arena> dropped;
  absl::MutexLock lock(&mu_);
  // A handle still materializing gives back its bytes when the worker
  // finishes (MarkReady drops the arena); report them now.
  const uint64_t bytes = state_ == v1::HANDLE_STATE_MATERIALIZING
                             ? spec_.layout.arena_bytes
                         : arena_ != nullptr ? arena_->bytes()
                                             : 0;
  // The name goes now, even while a fetch still reads the arena: nobody
  // can map it after the release.
  if (arena_ != nullptr) arena_->UnlinkSharedMemory();
  dropped = std::move(arena_);
  return bytes;
}

bool Handle::released() const {
  absl::MutexLock lock(&mu_);
  return released_;
}

absl::StatusOr<uint32_t> Handle::AddExport(ExportRecord record) {
  absl::MutexLock lock(&mu_);
  if (released_) {
    return absl::FailedPreconditionError(
        absl::StrCat("handle ", id_, " is being released"));
  }
  exports_.push_back(std::move(record));
  return static_cast<uint32_t>(exports_.size());
}

absl::StatusOr<uint32_t> Handle::CloseExport(absl::string_view export_id) {
  ExportRecord closed;  // dropped (maybe freeing CUDA memory) unlocked
  absl::MutexLock lock(&mu_);
  for (auto it = exports_.begin(); it != exports_.end(); ++it) {
    if (it->id == export_id) {
      closed = std::move(*it);
      exports_.erase(it);
      return static_cast<uint32_t>(exports_.size());
    }
  }
  return absl::NotFoundError(
      absl::StrCat("export ", Quote(export_id),
                   " not found (it was closed already, or it "
                   "belongs to another client)"));
}

uint32_t Handle::num_exports() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(exports_.size());
}

absl::StatusOr<std::shared_ptr<const Handle::Digests>> Handle::TensorDigests(
    const std::function<absl::StatusOr<Digests>()>& compute) const {
  absl::MutexLock lock(&compute_mu_);
  if (tensor_digests_ == nullptr) {
    absl::StatusOr<Digests> digests = compute();
    if (!digests.ok()) return digests.status();
    tensor_digests_ = std::make_shared<const Digests>(std::move(*digests));
  }
  return tensor_digests_;
}

absl::StatusOr<std::shared_ptr<const Handle::Crcs>> Handle::TensorCrcs(
    const std::function<absl::StatusOr<Crcs>()>& compute) const {
  absl::MutexLock lock(&compute_mu_);
  if (tensor_crcs_ == nullptr) {
    absl::StatusOr<Crcs> crcs = compute();
    if (!crcs.ok()) return crcs.status();
    tensor_crcs_ = std::make_shared<const Crcs>(std::move(*crcs));
  }
  return tensor_crcs_;
}

absl::StatusOr<std::shared_ptr<const Handle::Fingerprints>>
Handle::TensorFingerprints(
    const std::function<absl::StatusOr<Fingerprints>()>& compute) const {
  absl::MutexLock lock(&compute_mu_);
  if (tensor_fingerprints_ == nullptr) {
    absl::StatusOr<Fingerprints> values = compute();
    if (!values.ok()) return values.status();
    tensor_fingerprints_ =
        std::make_shared<const Fingerprints>(std::move(*values));
  }
  return tensor_fingerprints_;
}

std::string Handle::FileDigest(const FileKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = file_digests_.find(key);
  return it == file_digests_.end() ? std::string() : it->second;
}

void Handle::SetFileDigest(const FileKey& key,
                           const std::string& digest) const {
  absl::MutexLock lock(&mu_);
  if (!file_digests_.insert_or_assign(key, digest).second) return;
  file_digest_order_.push_back(key);
  while (file_digest_order_.size() > kMaxFileDigests) {
    file_digests_.erase(file_digest_order_.front());
    file_digest_order_.pop_front();
  }
}

size_t Handle::num_file_digests() const {
  absl::MutexLock lock(&mu_);
  return file_digests_.size();
}

}  // namespace materializer::registry
