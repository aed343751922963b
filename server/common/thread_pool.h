#ifndef MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_
#define MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace materializer {

// A fixed set of worker threads running scheduled closures in FIFO order.
// Used to keep long work (allocation, init) off gRPC's callback threads.
//
// Thread-safe. The destructor runs every closure already scheduled, then
// joins the workers; scheduling after destruction has begun is a bug.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> work);

  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkLoop();

  absl::Mutex mu_;
  // Guards queue_ and stopping_.
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_THREAD_POOL_H_
