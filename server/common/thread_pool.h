#ifndef MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_
#define MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace materializer {

// A fixed set of worker threads shared fairly between clients. All request
// work runs here, never on gRPC's callback threads.
//
// Work is scheduled under a key (the caller's identity). Each key has its
// own FIFO queue; idle workers serve the keys that have work in round-robin
// order, and at most `max_running_per_key` closures of one key run at once
// (by default one less than the number of workers). So a client that
// floods the server with slow calls gets its turn like everyone else and
// never holds every worker: another client's call waits for at most one
// closure to finish, not for the flood.
//
//   ThreadPool::Options options;
//   options.threads = 8;
//   ThreadPool pool(options);
//   if (!pool.TrySchedule(caller.identity, [=] { ... })) { /* queue full */ }
//
// Thread-safe. The destructor runs every closure already scheduled, then
// joins the workers; scheduling after destruction has begun is a bug.
class ThreadPool {
 public:
  struct Options {
    int threads = 1;
    // Most closures of one key running at once; 0: threads - 1 (at least 1).
    int max_running_per_key = 0;
    // Most closures of one key waiting, beyond which TrySchedule refuses;
    // 0: no limit.
    size_t max_queued_per_key = 0;
  };

  explicit ThreadPool(int num_threads);
  explicit ThreadPool(Options options);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `work` under `key`; always accepted (continuations of work
  // already admitted, such as the next chunk of a fetch).
  void Schedule(absl::string_view key, std::function<void()> work);
  // Under the empty key (work of no particular client).
  void Schedule(std::function<void()> work) { Schedule("", std::move(work)); }

  // Queues `work` under `key` unless the key already has
  // max_queued_per_key closures waiting; returns false then, and nothing
  // is queued. New calls are admitted this way.
  bool TrySchedule(absl::string_view key, std::function<void()> work);

  int num_threads() const { return static_cast<int>(threads_.size()); }
  int max_running_per_key() const { return max_running_; }
  size_t max_queued_per_key() const { return max_queued_; }

 private:
  struct Lane {
    std::deque<std::function<void()>> queue;
    int running = 0;
    // In ready_ (has queued work and room to run more).
    bool ready = false;
  };

  bool Enqueue(absl::string_view key, std::function<void()> work,
               bool bounded);
  void WorkLoop();
  // Puts `key` at the back of the round if it can run more now.
  void MaybeReady(const std::string& key, Lane& lane)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_running_;
  const size_t max_queued_;

  absl::Mutex mu_;
  // Guards lanes_, ready_, queued_ and stopping_.
  absl::flat_hash_map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  // Keys whose next closure may run now, in serving order.
  std::deque<std::string> ready_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_
