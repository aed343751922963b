#include "server/load/range_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace materializer::load {

namespace {

RangeCache::Options Normalized(RangeCache::Options options) {
  if (options.block_bytes == 0) options.block_bytes = uint64_t{4} << 20;
  return options;
}

constexpr uint64_t kPage = 4096;
// Spare buffers kept whatever the budget (reads in flight).
constexpr uint64_t kSlackBuffers = 4;

uint64_t BufferBytes(uint64_t block_bytes) {
  return std::max(kPage, (block_bytes + kPage - 1) / kPage * kPage);
}

}  // namespace

class RangeCache::BufferPool {
 public:
  BufferPool(uint64_t buffer_bytes, uint64_t capacity_bytes)
      : buffer_bytes_(buffer_bytes), capacity_bytes_(capacity_bytes) {}
  ~BufferPool() {
    for (char* p : spare_) std::free(p);
  }

  // A buffer of buffer_bytes, page aligned, contents undefined; null when
  // memory runs out.
  char* Take() {
    {
      absl::MutexLock lock(&mu_);
      if (!spare_.empty()) {
        char* p = spare_.back();
        spare_.pop_back();
        return p;
      }
    }
    return static_cast<char*>(std::aligned_alloc(kPage, buffer_bytes_));
  }

  // Keeps `p` for the next Take while the spares and `cached_bytes` (the
  // cache's blocks) fit the budget, else frees it.
  void Give(char* p, uint64_t cached_bytes) {
    {
      absl::MutexLock lock(&mu_);
      const uint64_t spare_bytes = (spare_.size() + 1) * buffer_bytes_;
      if (spare_.size() < kSlackBuffers ||
          cached_bytes + spare_bytes <= capacity_bytes_) {
        spare_.push_back(p);
        return;
      }
    }
    std::free(p);
  }

  // The cache's cached bytes, for Give (set under the cache's lock).
  std::atomic<uint64_t> cached_bytes{0};

 private:
  const uint64_t buffer_bytes_;
  const uint64_t capacity_bytes_;
  absl::Mutex mu_;
  std::vector<char*> spare_ ABSL_GUARDED_BY(mu_);
};

RangeCache::Bytes::~Bytes() {
  if (data != nullptr) pool->Give(data, pool->cached_bytes.load());
}

RangeCache::RangeCache(Options options)
    : options_(Normalized(options)),
      pool_(std::make_shared<BufferPool>(BufferBytes(options_.block_bytes),
                                         options_.capacity_bytes)) {}

absl::Status RangeCache::Read(const FileSource& file, uint64_t offset,
                              uint64_t length, void* dst,
                              Counters* counters) {
  auto* out = static_cast<char*>(dst);
  return Visit(
      file, offset, length,
      [&out](const char* data, uint64_t n) {
        std::memcpy(out, data, n);
        out += n;
        return absl::OkStatus();
      },
      counters);
}

absl::Status RangeCache::Visit(const FileSource& file, uint64_t offset,
                               uint64_t length, const Consumer& consume,
                               Counters* counters) {
  const uint64_t size = file.key().size;
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        file.label(), ": bytes [", offset, ", ", offset + length,
        ") pass the end of the file (", size, " bytes)"));
  }
  const uint64_t block = options_.block_bytes;
  uint64_t at = offset;
  const uint64_t end = offset + length;
  while (at < end) {
    const uint64_t index = at / block;
    bool read = false;
    absl::StatusOr<std::shared_ptr<const Bytes>> bytes =
        GetBlock(file, index, counters, &read);
    if (!bytes.ok()) return bytes.status();
    const uint64_t block_start = index * block;
    const uint64_t take = std::min(end, block_start + (*bytes)->size) - at;
    absl::Status status =
        consume((*bytes)->data + (at - block_start), take);
    if (!status.ok()) return status;
    if (!read) {
      counters->bytes_from_cache += take;
      served_bytes_.fetch_add(take, std::memory_order_relaxed);
    }
    at += take;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const RangeCache::Bytes>> RangeCache::GetBlock(
    const FileSource& file, uint64_t index, Counters* counters, bool* read) {
  *read = false;
  const BlockKey key{file.key(), index};
  std::shared_ptr<Block> block;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(key);
    if (it != blocks_.end()) {
      block = it->second;
      mu_.Await(absl::Condition(&block->done));
      if (!block->status.ok()) return block->status;
      if (block->in_lru) lru_.splice(lru_.end(), lru_, block->lru);
      return block->bytes;
    }
    block = std::make_shared<Block>();
    blocks_.emplace(key, block);
  }

  // This caller reads; the others wait on `done`.
  const uint64_t start = index * options_.block_bytes;
  const uint64_t length =
      std::min(options_.block_bytes, file.key().size - start);
  auto bytes = std::make_shared<Bytes>();
  bytes->pool = pool_;
  bytes->data = pool_->Take();
  bytes->size = length;
  absl::Status status =
      bytes->data == nullptr
          ? absl::ResourceExhaustedError(absl::StrCat(
                "cannot allocate a ", length, "-byte block of ", file.label()))
          : file.ReadAt(start, length, bytes->data);
  // A file rewritten during the read may have given mixed bytes: they are
  // refused, not kept.
  if (status.ok()) status = file.Check();

  absl::MutexLock lock(&mu_);
  block->status = status;
  block->done = true;
  if (!status.ok()) {
    blocks_.erase(key);
    return status;
  }
  block->bytes = std::move(bytes);
  read_bytes_ += length;
  counters->bytes_read_from_files += length;
  *read = true;
  if (options_.capacity_bytes >= length) {
    block->lru = lru_.insert(lru_.end(), key);
    block->in_lru = true;
    cached_bytes_ += length;
    pool_->cached_bytes = cached_bytes_;
    EvictLocked();
  } else {
    blocks_.erase(key);  // nothing kept; the waiters hold the block
  }
  return block->bytes;
}

void RangeCache::EvictLocked() {
  while (cached_bytes_ > options_.capacity_bytes && !lru_.empty()) {
    auto it = blocks_.find(lru_.front());
    lru_.pop_front();
    if (it == blocks_.end()) continue;
    const uint64_t size = it->second->bytes->size;
    cached_bytes_ -= size;
    pool_->cached_bytes = cached_bytes_;
    evicted_bytes_ += size;
    it->second->in_lru = false;
    blocks_.erase(it);  // readers still holding the bytes keep them alive
  }
}

RangeCache::Stats RangeCache::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats;
  stats.capacity_bytes = options_.capacity_bytes;
  stats.cached_bytes = cached_bytes_;
  stats.bytes_read_from_files = read_bytes_;
  stats.bytes_served_from_cache = served_bytes_.load(std::memory_order_relaxed);
  stats.evicted_bytes = evicted_bytes_;
  return stats;
}

}  // namespace materializer::load
