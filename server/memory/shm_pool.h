#ifndef MATERIALIZER_SERVER_MEMORY_SHM_POOL_H_
#define MATERIALIZER_SERVER_MEMORY_SHM_POOL_H_

// Shared memory made resident before anyone asks for it.
//
// A fresh 4 KiB page of /dev/shm costs about 2.5 us on the 2-core VM
// (allocate, clear, insert into the file, map): for llama-1b's 4.4 GB that
// is 1.35 s of the server's 1.9 s Materialize, more than the init itself
// (docs/architecture.md, "Host memory"). The pool pays that price while
// the server is idle: it keeps up to `target_bytes` of /dev/shm files
// ("slabs", `slab_bytes` each) populated and mapped, and an exportable
// arena is assembled from slabs (mremap into one contiguous range; the
// export lists the files) instead of fresh pages.
//
//   SharedMemoryPool pool({.target_bytes = 8 << 30});
//   {
//     SharedMemoryPool::Active busy = pool.MarkActive();  // refill waits
//     std::vector<SharedMemorySlab> slabs = pool.Take(3);
//     ...                                // the caller owns them now
//   }
//
// Every slab is a fresh file that nobody has used: a slab is handed out
// once and never comes back (its file is unlinked when its arena is
// released), so no client ever sees another's bytes. The refill runs on
// one thread of its own, only when no request has been active for
// `quiet` (MarkActive), so it competes with nobody's call. The pool's
// bytes are the server's, not charged to any client (like the checkpoint
// cache); GetStats and /metrics show them.
//
// Thread-safe.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace materializer::memory {

// One populated file, mapped shared (read-write) in this process at
// `pages`. Owned by whoever holds it; ReleaseSlab frees it.
struct SharedMemorySlab {
  std::string path;
  int fd = -1;  // O_RDWR, holding LOCK_SH (a live file for the stale sweep)
  std::byte* pages = nullptr;
  uint64_t bytes = 0;
};

// Unmaps, unlinks and closes a slab nobody will use.
void ReleaseSlab(SharedMemorySlab& slab);

class SharedMemoryPool {
 public:
  struct Options {
    // What the pool keeps resident when idle (adaptive: the most it
    // keeps); 0 turns it off.
    uint64_t target_bytes = 0;
    // Learn the target from the bursts of Takes, up to target_bytes.
    bool adaptive = false;
    // Adaptive only: after this long without a Take, free every slab and
    // forget what was learned.
    absl::Duration release_after = absl::Minutes(15);
    // Bytes of host memory that no client holds now (the CPU devices'
    // free bytes in the ledger); the pool keeps its own bytes within
    // them. Unset: no bound but target_bytes.
    std::function<uint64_t()> headroom;
    // Size of each file (a multiple of the page size).
    uint64_t slab_bytes = uint64_t{128} << 20;
    std::string dir = "/dev/shm";
    // How long after the last request the refill may start.
    absl::Duration quiet = absl::Seconds(1);
  };

  explicit SharedMemoryPool(Options options);
  // Stops the refill and frees every slab still in the pool.
  ~SharedMemoryPool();
  SharedMemoryPool(const SharedMemoryPool&) = delete;
  SharedMemoryPool& operator=(const SharedMemoryPool&) = delete;

  uint64_t slab_bytes() const { return options_.slab_bytes; }
  const std::string& dir() const { return options_.dir; }

  // How many slabs an arena of `bytes` takes: one per whole slab, and one
  // for the remainder unless it is under a quarter of a slab (cutting a
  // slab down to a sliver would waste the refill's work on it; the
  // sliver's fresh pages cost little).
  size_t SlabsFor(uint64_t bytes) const;

  // Removes up to `count` slabs from the pool (fewer when it holds fewer)
  // and hands them to the caller. An adaptive pool learns from `count`,
  // not from what it had.
  std::vector<SharedMemorySlab> Take(size_t count);

  // Frees slabs until what the pool keeps, less the `taking` bytes about
  // to leave it through Take, fits in the headroom: called after a
  // reservation and before its arena is allocated, so that the pool never
  // stands between a client and memory the ledger gave it.
  void Trim(uint64_t taking);

  // While an Active is alive the refill does not start a slab; after the
  // last one goes it waits `quiet` more.
  class Active {
   public:
    explicit Active(SharedMemoryPool* pool);
    ~Active();
    Active(Active&& other) noexcept : pool_(other.pool_) {
      other.pool_ = nullptr;
    }
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;
    Active& operator=(Active&&) = delete;

   private:
    SharedMemoryPool* pool_;
  };
  Active MarkActive() { return Active(this); }

  struct Stats {
    // What the refill works toward now (adaptive: learned so far).
    uint64_t target_bytes = 0;
    uint64_t max_bytes = 0;  // options.target_bytes
    bool adaptive = false;
    uint64_t bytes = 0;  // resident in the pool now
    uint64_t taken_bytes_total = 0;
    uint64_t filled_bytes_total = 0;
    // Freed without being taken: for the headroom, or unused.
    uint64_t trimmed_bytes_total = 0;
    // Why the last refill failed (a full /dev/shm), or "".
    std::string last_error;
  };
  Stats stats() const;

  // Blocks until the pool holds its target or `timeout` passes; true if
  // full. For tests and benchmarks that measure a warm pool.
  bool WaitUntilFull(absl::Duration timeout);

 private:
  void RefillLoop();
  bool FullLocked() const;
  // The target the refill works toward: fixed, or the largest burst so
  // far (the current one included), capped.
  uint64_t NextTargetLocked() const;
  // Adaptive: folds a finished burst into the target, and frees
  // everything once the pool has gone unused for release_after. Returns
  // the slabs to free (outside the lock).
  std::vector<SharedMemorySlab> AdaptLocked(absl::Time now);
  uint64_t HeadroomBytes() const;
  // Removes slabs until bytes_ <= keep; returns them to free.
  std::vector<SharedMemorySlab> ShrinkLocked(uint64_t keep);

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<SharedMemorySlab> slabs_;  // guarded by mu_
  uint64_t bytes_ = 0;                   // guarded by mu_
  int active_ = 0;                       // guarded by mu_
  absl::Time last_active_ = absl::InfinitePast();  // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  uint64_t taken_total_ = 0;             // guarded by mu_
  uint64_t filled_total_ = 0;            // guarded by mu_
  uint64_t trimmed_total_ = 0;           // guarded by mu_
  uint64_t target_ = 0;                  // learned (adaptive); guarded
  uint64_t burst_ = 0;                   // asked for since quiet; guarded
  absl::Time last_take_ = absl::InfinitePast();  // guarded by mu_
  std::string last_error_;               // guarded by mu_
  std::thread refill_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_SHM_POOL_H_
