#include "server/memory/shm_pool.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/memory/shm_file.h"

namespace materializer::memory {
namespace {

// After a failed refill (a full /dev/shm, say) the next try waits this
// long, unless a Take makes room first.
constexpr absl::Duration kRetryAfterError = absl::Seconds(10);

// How often a refill held back by the headroom looks again (clients
// releasing memory do not tell the pool).
constexpr absl::Duration kHeadroomPoll = absl::Milliseconds(500);

// A fresh slab: a file of `bytes`, mapped shared and made resident on one
// thread (the refill must not take the cores a request could use).
absl::StatusOr<SharedMemorySlab> NewSlab(const std::string& dir,
                                         uint64_t bytes) {
  absl::StatusOr<SharedMemoryFile> file = CreateSharedMemoryFile(dir, bytes);
  if (!file.ok()) return file.status();
  SharedMemorySlab slab;
  slab.path = file->path;
  slab.fd = file->fd;
  slab.bytes = bytes;
  // At a 2 MiB boundary, so that a huge-page tmpfs maps it with 2 MiB
  // pages (and mremap keeps them when the slab joins an arena).
  std::byte* range = ReserveAddressSpace(bytes);
  void* pages = range == nullptr
                    ? MAP_FAILED
                    : mmap(range, bytes, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_FIXED, slab.fd, 0);
  if (pages == MAP_FAILED) {
    const int error = errno;
    if (range != nullptr) munmap(range, bytes);
    ReleaseSlab(slab);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map a shared-memory slab: ", std::strerror(error)));
  }
  slab.pages = static_cast<std::byte*>(pages);
  absl::StatusOr<bool> populated =
      PopulateForWrite(slab.pages, bytes, /*threads=*/1,
                       absl::StrCat("shared memory in ", dir));
  int error = 0;
  if (populated.ok() && !*populated) {
    error = posix_fallocate(slab.fd, 0, static_cast<off_t>(bytes));
    if (error == 0) {
      // An older kernel: touch every page so that it is mapped here.
      for (uint64_t at = 0; at < bytes; at += 4096) {
        slab.pages[at] = std::byte{0};
      }
    }
  }
  if (!populated.ok() || error != 0) {
    ReleaseSlab(slab);
    return populated.ok()
               ? absl::ResourceExhaustedError(
                     absl::StrCat("cannot allocate a shared-memory slab in ",
                                  dir, ": ", std::strerror(error)))
               : populated.status();
  }
  return slab;
}

}  // namespace

void ReleaseSlab(SharedMemorySlab& slab) {
  if (slab.pages != nullptr) munmap(slab.pages, slab.bytes);
  slab.pages = nullptr;
  SharedMemoryFile file{slab.path, slab.fd};
  CloseSharedMemoryFile(file);
  slab.fd = -1;
  slab.path.clear();
}

namespace {

void ReleaseSlabs(std::vector<SharedMemorySlab>& slabs) {
  for (SharedMemorySlab& slab : slabs) ReleaseSlab(slab);
  slabs.clear();
}

}  // namespace

SharedMemoryPool::SharedMemoryPool(Options options)
    : options_(std::move(options)) {
  if (options_.target_bytes >= options_.slab_bytes &&
      options_.slab_bytes > 0) {
    refill_ = std::thread([this] { RefillLoop(); });
  }
}

SharedMemoryPool::~SharedMemoryPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (refill_.joinable()) refill_.join();
  for (SharedMemorySlab& slab : slabs_) ReleaseSlab(slab);
}

uint64_t SharedMemoryPool::NextTargetLocked() const {
  if (!options_.adaptive) return options_.target_bytes;
  return std::min(options_.target_bytes, std::max(target_, burst_));
}

bool SharedMemoryPool::FullLocked() const {
  return bytes_ + options_.slab_bytes > NextTargetLocked();
}

uint64_t SharedMemoryPool::HeadroomBytes() const {
  return options_.headroom ? options_.headroom()
                           : std::numeric_limits<uint64_t>::max();
}

size_t SharedMemoryPool::SlabsFor(uint64_t bytes) const {
  const uint64_t slab = options_.slab_bytes;
  if (slab == 0) return 0;
  const uint64_t remainder = bytes % slab;
  return static_cast<size_t>(bytes / slab + (remainder >= slab / 4 ? 1 : 0));
}

std::vector<SharedMemorySlab> SharedMemoryPool::ShrinkLocked(uint64_t keep) {
  std::vector<SharedMemorySlab> out;
  while (bytes_ > keep && !slabs_.empty()) {
    out.push_back(std::move(slabs_.back()));
    slabs_.pop_back();
    bytes_ -= out.back().bytes;
    trimmed_total_ += out.back().bytes;
  }
  return out;
}

std::vector<SharedMemorySlab> SharedMemoryPool::AdaptLocked(absl::Time now) {
  if (!options_.adaptive) return {};
  if (burst_ > 0 && active_ == 0 && now >= last_active_ + options_.quiet) {
    target_ = std::min(options_.target_bytes, std::max(target_, burst_));
    burst_ = 0;
  }
  if ((bytes_ > 0 || target_ > 0) && active_ == 0 &&
      now >= last_take_ + options_.release_after) {
    MLOG(INFO) << "shared-memory pool: unused for " << options_.release_after
               << "; freeing " << bytes_ << " bytes";
    target_ = 0;
    burst_ = 0;
    return ShrinkLocked(0);
  }
  return {};
}

void SharedMemoryPool::Trim(uint64_t taking) {
  std::vector<SharedMemorySlab> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t headroom = HeadroomBytes();
    const uint64_t leaving = std::min(taking, bytes_);
    const uint64_t keep =
        headroom > std::numeric_limits<uint64_t>::max() - leaving
            ? std::numeric_limits<uint64_t>::max()
            : headroom + leaving;
    freed = ShrinkLocked(keep);
  }
  if (!freed.empty()) {
    MLOG(INFO) << "shared-memory pool: gave back " << freed.size()
               << " slabs to make room for a reservation";
  }
  ReleaseSlabs(freed);
}

std::vector<SharedMemorySlab> SharedMemoryPool::Take(size_t count) {
  std::vector<SharedMemorySlab> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    burst_ += static_cast<uint64_t>(count) * options_.slab_bytes;
    while (out.size() < count && !slabs_.empty()) {
      out.push_back(std::move(slabs_.back()));
      slabs_.pop_back();
      bytes_ -= out.back().bytes;
      taken_total_ += out.back().bytes;
    }
    last_active_ = absl::Now();
    last_take_ = last_active_;
    if (!out.empty()) last_error_.clear();  // room again: retry at once
  }
  changed_.notify_all();
  return out;
}

SharedMemoryPool::Active::Active(SharedMemoryPool* pool) : pool_(pool) {
  if (pool_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  ++pool_->active_;
}

SharedMemoryPool::Active::~Active() {
  if (pool_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pool_->mu_);
    --pool_->active_;
    pool_->last_active_ = absl::Now();
  }
  pool_->changed_.notify_all();
}

SharedMemoryPool::Stats SharedMemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats;
  stats.target_bytes = NextTargetLocked();
  stats.max_bytes = options_.target_bytes;
  stats.adaptive = options_.adaptive;
  stats.bytes = bytes_;
  stats.trimmed_bytes_total = trimmed_total_;
  stats.taken_bytes_total = taken_total_;
  stats.filled_bytes_total = filled_total_;
  stats.last_error = last_error_;
  return stats;
}

bool SharedMemoryPool::WaitUntilFull(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (!FullLocked()) {
    const absl::Time now = absl::Now();
    if (now >= deadline || !refill_.joinable()) return false;
    changed_.wait_for(lock, absl::ToChronoNanoseconds(deadline - now));
  }
  return true;
}

void SharedMemoryPool::RefillLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time retry_at = absl::InfinitePast();
  while (!stop_) {
    const absl::Time now = absl::Now();
    std::vector<SharedMemorySlab> unused = AdaptLocked(now);
    if (!unused.empty()) {
      lock.unlock();
      ReleaseSlabs(unused);
      lock.lock();
      changed_.notify_all();
      continue;
    }
    if (FullLocked() || active_ > 0) {
      // Wake for what AdaptLocked waits on: the end of a burst, and the
      // release of an unused pool.
      absl::Time wake = absl::InfiniteFuture();
      if (options_.adaptive && burst_ > 0 && active_ == 0) {
        wake = last_active_ + options_.quiet;
      }
      if (options_.adaptive && (bytes_ > 0 || target_ > 0) && active_ == 0) {
        wake = std::min(wake, last_take_ + options_.release_after);
      }
      if (wake == absl::InfiniteFuture()) {
        changed_.wait(lock);
      } else if (now < wake) {
        changed_.wait_for(lock, absl::ToChronoNanoseconds(wake - now));
      }
      continue;
    }
    const absl::Time start_at =
        std::max(last_active_ + options_.quiet,
                 last_error_.empty() ? absl::InfinitePast() : retry_at);
    if (now < start_at) {
      changed_.wait_for(lock, absl::ToChronoNanoseconds(start_at - now));
      continue;
    }
    if (bytes_ + options_.slab_bytes > HeadroomBytes()) {
      // The clients' reservations leave no room for another slab.
      changed_.wait_for(lock, absl::ToChronoNanoseconds(kHeadroomPoll));
      continue;
    }
    lock.unlock();
    absl::StatusOr<SharedMemorySlab> slab =
        NewSlab(options_.dir, options_.slab_bytes);
    lock.lock();
    if (!slab.ok()) {
      if (last_error_.empty()) {
        MLOG(WARNING) << "shared-memory pool: " << slab.status().message()
                      << " (holding " << bytes_ << " of "
                      << NextTargetLocked() << " bytes; retrying in "
                      << kRetryAfterError << ")";
      }
      last_error_ = std::string(slab.status().message());
      retry_at = absl::Now() + kRetryAfterError;
      continue;
    }
    if (bytes_ + slab->bytes > HeadroomBytes()) {
      // A reservation took the room while the slab was being filled.
      trimmed_total_ += slab->bytes;
      lock.unlock();
      ReleaseSlab(*slab);
      lock.lock();
      continue;
    }
    bytes_ += slab->bytes;
    filled_total_ += slab->bytes;
    slabs_.push_back(std::move(*slab));
    changed_.notify_all();
  }
}

}  // namespace materializer::memory
