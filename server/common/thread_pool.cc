#include "server/common/thread_pool.h"

#include <algorithm>
#include <utility>

namespace materializer {
namespace {

ThreadPool::Options WithThreads(int threads) {
  ThreadPool::Options options;
  options.threads = threads;
  return options;
}

int Threads(const ThreadPool::Options& options) {
  return std::max(1, options.threads);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : ThreadPool(WithThreads(num_threads)) {}

ThreadPool::ThreadPool(Options options)
    : max_running_(options.max_running_per_key > 0
                       ? options.max_running_per_key
                       : std::max(1, Threads(options) - 1)),
      max_queued_(options.max_queued_per_key) {
  const int threads = Threads(options);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { WorkLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::Schedule(absl::string_view key, std::function<void()> work) {
  Enqueue(key, std::move(work), /*bounded=*/false);
}

bool ThreadPool::TrySchedule(absl::string_view key,
                             std::function<void()> work) {
  return Enqueue(key, std::move(work), /*bounded=*/true);
}

bool ThreadPool::Enqueue(absl::string_view key, std::function<void()> work,
                         bool bounded) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = lanes_.try_emplace(key);
  Lane& lane = it->second;
  if (bounded && max_queued_ > 0 && lane.queue.size() >= max_queued_) {
    if (inserted) lanes_.erase(it);
    return false;
  }
  lane.queue.push_back(std::move(work));
  ++queued_;
  MaybeReady(it->first, lane);
  return true;
}

void ThreadPool::MaybeReady(const std::string& key, Lane& lane) {
  if (!lane.ready && !lane.queue.empty() && lane.running < max_running_) {
    lane.ready = true;
    ready_.push_back(key);
  }
}

void ThreadPool::WorkLoop() {
  while (true) {
    std::function<void()> work;
    std::string key;
    {
      absl::MutexLock lock(&mu_);
      // Closures of a key at its limit become ready when one of its running
      // closures ends, so stop only once nothing is queued at all.
      mu_.Await(absl::Condition(
          +[](ThreadPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
            return !pool->ready_.empty() ||
                   (pool->stopping_ && pool->queued_ == 0);
          },
          this));
      if (ready_.empty()) return;  // stopping_ and drained
      key = std::move(ready_.front());
      ready_.pop_front();
      Lane& lane = lanes_.at(key);
      lane.ready = false;
      work = std::move(lane.queue.front());
      lane.queue.pop_front();
      --queued_;
      ++lane.running;
      MaybeReady(key, lane);  // back of the round
    }
    work();
    work = nullptr;  // destroy what the closure captured outside the lock
    absl::MutexLock lock(&mu_);
    auto it = lanes_.find(key);
    Lane& lane = it->second;
    --lane.running;
    if (lane.queue.empty() && lane.running == 0) {
      lanes_.erase(it);
    } else {
      MaybeReady(key, lane);
    }
  }
}

}  // namespace materializer
