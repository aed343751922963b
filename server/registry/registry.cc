#include "server/registry/registry.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/quote.h"

namespace materializer::registry {
namespace {

absl::Status NotFound(absl::string_view id) {
  return absl::NotFoundError(
      absl::StrCat("handle ", Quote(id), " not found (it does not exist, or it "
                                        "belongs to another client)"));
}

}  // namespace

std::string NewHandleId() {
  unsigned char bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::abort();  // no entropy source: unguessable ids are impossible
    }
    filled += static_cast<size_t>(n);
  }
  std::string id = "h-";
  for (unsigned char b : bytes) {
    absl::StrAppend(&id, absl::Hex(b, absl::kZeroPad2));
  }
  return id;
}

std::shared_ptr<Handle> HandleRegistry::Create(HandleSpec spec) {
  auto handle =
      std::make_shared<Handle>(NewHandleId(), absl::Now(), std::move(spec));
  absl::MutexLock lock(&mu_);
  handles_.emplace(handle->id(), handle);
  return handle;
}

absl::StatusOr<std::shared_ptr<Handle>> HandleRegistry::Get(
    absl::string_view owner, absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(id);
  if (it == handles_.end() || it->second->spec().owner != owner) {
    return NotFound(id);
  }
  it->second->Renew(absl::Now());
  return it->second;
}

absl::StatusOr<ReleaseResult> HandleRegistry::Release(absl::string_view owner,
                                                      absl::string_view id,
                                                      bool force) {
  std::shared_ptr<Handle> handle;
  {
    absl::MutexLock lock(&mu_);
    auto it = handles_.find(id);
    if (it == handles_.end() || it->second->spec().owner != owner) {
      auto gone = released_.find(id);
      if (gone != released_.end() && gone->second == owner) {
        return ReleaseResult{/*released=*/false, /*freed_bytes=*/0};
      }
      return NotFound(id);
    }
    // Refused while exported (unless forced) before anything changes.
    if (absl::Status status = it->second->BeginRelease(force); !status.ok()) {
      return status;
    }
    handle = std::move(it->second);
    handles_.erase(it);
    if (handle->num_exports() > 0) draining_.emplace(handle->id(), handle);
    released_.emplace(handle->id(), handle->spec().owner);
    released_order_.push_back(handle->id());
    if (released_order_.size() > kReleasedMemory) {
      released_.erase(released_order_.front());
      released_order_.pop_front();
    }
  }
  // Outside the lock: dropping the arena may unmap gigabytes.
  return ReleaseResult{/*released=*/true, handle->FinishRelease()};
}

absl::StatusOr<std::shared_ptr<Handle>> HandleRegistry::GetExported(
    absl::string_view owner, absl::string_view id) const {
  absl::MutexLock lock(&mu_);
  for (const auto* table : {&handles_, &draining_}) {
    auto it = table->find(id);
    if (it != table->end() && it->second->spec().owner == owner) {
      return it->second;
    }
  }
  return NotFound(id);
}

void HandleRegistry::ExportClosed(absl::string_view id) {
  std::shared_ptr<Handle> handle;  // dropped unlocked
  absl::MutexLock lock(&mu_);
  auto it = draining_.find(id);
  if (it == draining_.end() || it->second->num_exports() > 0) return;
  handle = std::move(it->second);
  draining_.erase(it);
}

uint64_t HandleRegistry::ReleaseSession(absl::string_view session) {
  std::vector<std::shared_ptr<Handle>> bound;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, handle] : handles_) {
      if (!handle->spec().session.empty() &&
          handle->spec().session == session) {
        bound.push_back(handle);
      }
    }
  }
  uint64_t freed = 0;
  for (const std::shared_ptr<Handle>& handle : bound) {
    absl::StatusOr<ReleaseResult> result =
        Release(handle->spec().owner, handle->id(), /*force=*/true);
    if (result.ok()) freed += result->freed_bytes;
  }
  return freed;
}

std::vector<std::string> HandleRegistry::ReleaseExpired(absl::Time now) {
  std::vector<std::shared_ptr<Handle>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, handle] : handles_) {
      if (handle->lease_expiry() <= now && handle->num_exports() == 0) {
        expired.push_back(handle);
      }
    }
  }
  std::vector<std::string> ids;
  for (const std::shared_ptr<Handle>& handle : expired) {
    if (Release(handle->spec().owner, handle->id()).ok()) {
      ids.push_back(handle->id());
    }
  }
  return ids;
}

void HandleRegistry::Forget(absl::string_view id) {
  std::shared_ptr<Handle> handle;
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) return;
  handle = std::move(it->second);
  handles_.erase(it);
}

std::vector<std::shared_ptr<Handle>> HandleRegistry::List(
    absl::string_view owner) const {
  std::vector<std::shared_ptr<Handle>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, handle] : handles_) {
      if (handle->spec().owner == owner) out.push_back(handle);
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a->created() != b->created()) return a->created() < b->created();
    return a->id() < b->id();
  });
  return out;
}

size_t HandleRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return handles_.size();
}

}  // namespace materializer::registry
