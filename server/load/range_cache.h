#ifndef MATERIALIZER_SERVER_LOAD_RANGE_CACHE_H_
#define MATERIALIZER_SERVER_LOAD_RANGE_CACHE_H_

// The checkpoint cache: file bytes the server read, kept in fixed-size
// blocks under a byte budget (least recently used goes first), so that the
// ranks and trainers of a node that load one checkpoint read it from
// storage once. Concurrent readers of a block that is not cached wait for
// one read (single flight). The budget is the server's, not a client's:
// cached bytes are not charged to any quota.
//
//   RangeCache cache({.capacity_bytes = 8 << 30});
//   RangeCache::Counters counted;
//   RETURN_IF_ERROR(cache.Read(file, offset, length, dst, &counted));
//
// A block is keyed by its file's identity (device, inode, size, mtime), so
// a file replaced or rewritten on disk is a different file: its old blocks
// are never served for it. A file that changes while a block is being read
// is detected by the reader (FileSource::Check after the read) and the
// block is dropped, never kept.
//
// Thread-safe: every method may be called from any thread.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace materializer::load {

// What identifies a file's contents: equal identities, equal bytes (as far
// as the file system tells).
struct FileKey {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;

  template <typename H>
  friend H AbslHashValue(H h, const FileKey& k) {
    return H::combine(std::move(h), k.device, k.inode, k.size, k.mtime_ns);
  }
  friend bool operator==(const FileKey& a, const FileKey& b) {
    return std::tie(a.device, a.inode, a.size, a.mtime_ns) ==
           std::tie(b.device, b.inode, b.size, b.mtime_ns);
  }
};

// An open file the cache reads blocks of. Implementations: a file
// descriptor (checkpoint_files.h), a string (tests).
class FileSource {
 public:
  virtual ~FileSource() = default;
  virtual const FileKey& key() const = 0;
  // For messages: "ROOT/relative/path".
  virtual const std::string& label() const = 0;
  // Reads exactly `length` bytes at `offset` (within key().size).
  virtual absl::Status ReadAt(uint64_t offset, uint64_t length,
                              void* dst) const = 0;
  // FAILED_PRECONDITION naming the file if it is no longer the file of
  // key() (size or mtime changed).
  virtual absl::Status Check() const = 0;
};

class RangeCache {
 public:
  struct Options {
    // Bytes of blocks kept after their readers are done. 0 keeps nothing
    // (concurrent readers still share one read).
    uint64_t capacity_bytes = 0;
    // Block size; reads are of whole blocks (the last one of a file is
    // shorter).
    uint64_t block_bytes = uint64_t{4} << 20;
  };

  // What one caller's reads cost (added to, never reset).
  struct Counters {
    // Whole blocks this caller read from files.
    uint64_t bytes_read_from_files = 0;
    // Bytes it copied out of blocks it did not read (kept ones, or ones a
    // concurrent caller read).
    uint64_t bytes_from_cache = 0;
  };

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t cached_bytes = 0;
    uint64_t bytes_read_from_files = 0;
    uint64_t bytes_served_from_cache = 0;
    uint64_t evicted_bytes = 0;
  };

  explicit RangeCache(Options options);
  RangeCache(const RangeCache&) = delete;
  RangeCache& operator=(const RangeCache&) = delete;

  // Copies file bytes [offset, offset + length) to `dst`, block by block.
  // OUT_OF_RANGE if the range passes the file's end; the file's errors
  // otherwise (nothing is cached from a failed or changed read).
  absl::Status Read(const FileSource& file, uint64_t offset, uint64_t length,
                    void* dst, Counters* counters);

  // The same bytes handed to `consume` in place, in order, one piece per
  // block (data valid during the call): a caller that converts them (a
  // dtype cast) writes its result once, with no staging copy. consume's
  // error stops the walk and is returned.
  using Consumer =
      std::function<absl::Status(const char* data, uint64_t length)>;
  absl::Status Visit(const FileSource& file, uint64_t offset, uint64_t length,
                     const Consumer& consume, Counters* counters);

  Stats stats() const;
  uint64_t block_bytes() const { return options_.block_bytes; }

 private:
  struct BlockKey {
    FileKey file;
    uint64_t index = 0;
    template <typename H>
    friend H AbslHashValue(H h, const BlockKey& k) {
      return H::combine(std::move(h), k.file, k.index);
    }
    friend bool operator==(const BlockKey& a, const BlockKey& b) {
      return a.file == b.file && a.index == b.index;
    }
  };
  // Block buffers, reused: a buffer the cache let go of (evicted, or never
  // kept) serves the next read, so reads do not pay the kernel a page fault
  // and a page clear per 4 KiB (a fresh 4 MiB buffer is 1,024 of them: a
  // quarter of a page-cached load's time). It keeps at most what the
  // budget leaves free beside the cached blocks, plus kSlackBuffers (the
  // reads in flight of a cache with no budget).
  class BufferPool;
  // A block's bytes: page aligned (a file opened O_DIRECT can read into
  // it) and never zero-filled first (the read writes every byte). The
  // buffer goes back to the pool when the last holder lets go.
  struct Bytes {
    ~Bytes();
    std::shared_ptr<BufferPool> pool;
    char* data = nullptr;
    uint64_t size = 0;
  };
  // A block being read or held. `bytes` is set (and `done`) once the read
  // finished; `status` is its outcome.
  struct Block {
    bool done = false;
    absl::Status status;
    std::shared_ptr<const Bytes> bytes;
    // Position in lru_ once done and kept.
    std::list<BlockKey>::iterator lru;
    bool in_lru = false;
  };

  // The block's bytes, reading it if no one has (or waiting for the reader
  // that is); *read says whether this call read it (and counted it in
  // `counters`).
  absl::StatusOr<std::shared_ptr<const Bytes>> GetBlock(
      const FileSource& file, uint64_t index, Counters* counters, bool* read);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  std::shared_ptr<BufferPool> pool_;
  mutable absl::Mutex mu_;
  // Guarded by mu_: every block being read or kept, the kept ones from
  // least to most recently used, their total, and the totals since start.
  absl::flat_hash_map<BlockKey, std::shared_ptr<Block>> blocks_
      ABSL_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes copied out of blocks this caller did not read.
  std::atomic<uint64_t> served_bytes_{0};
  uint64_t evicted_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace materializer::load

#endif  // MATERIALIZER_SERVER_LOAD_RANGE_CACHE_H_
