#include "server/memory/background_unmap.h"

#include <sys/mman.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "server/common/log.h"

namespace materializer::memory {
namespace {

class Unmapper {
 public:
  void Queue(void* addr, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      // Detached: the process's exit unmaps whatever is still queued.
      std::thread([this] { Run(); }).detach();
      started_ = true;
    }
    queue_.emplace_back(addr, bytes);
    ++queued_;
    work_.notify_one();
  }

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
  }

  uint64_t Pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_ - done_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return !queue_.empty(); });
      const std::pair<void*, size_t> range = queue_.front();
      queue_.pop_front();
      lock.unlock();
      if (munmap(range.first, range.second) != 0) {
        MLOG(WARNING) << "munmap of " << range.second
                      << " bytes: " << std::strerror(errno);
      }
      lock.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_cv_;
  std::deque<std::pair<void*, size_t>> queue_;
  uint64_t queued_ = 0;
  uint64_t done_ = 0;
  bool started_ = false;
};

// Never destroyed: its thread may still run while static destructors do.
Unmapper& TheUnmapper() {
  static Unmapper* unmapper = new Unmapper();
  return *unmapper;
}

}  // namespace

void UnmapInBackground(void* addr, size_t bytes) {
  if (addr == nullptr || bytes == 0) return;
  TheUnmapper().Queue(addr, bytes);
}

void WaitForBackgroundUnmaps() { TheUnmapper().Wait(); }

uint64_t PendingBackgroundUnmaps() { return TheUnmapper().Pending(); }

}  // namespace materializer::memory
