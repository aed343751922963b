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
    // What the pool keeps resident when idle; 0 turns it off.
    uint64_t target_bytes = 0;
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

  // Removes up to `count` slabs from the pool (fewer when it holds fewer)
  // and hands them to the caller.
  std::vector<SharedMemorySlab> Take(size_t count);

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
    uint64_t target_bytes = 0;
    uint64_t bytes = 0;  // resident in the pool now
    uint64_t taken_bytes_total = 0;
    uint64_t filled_bytes_total = 0;
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
  std::string last_error_;               // guarded by mu_
  std::thread refill_;
};

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_SHM_POOL_H_
