#include "server/common/thread_pool.h"

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace materializer {
namespace {

TEST(ThreadPoolTest, RunsEveryScheduledClosureBeforeDestruction) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 1000; ++i) {
      pool.Schedule([&done] { done.fetch_add(1); });
    }
  }
  EXPECT_EQ(done.load(), 1000);
}

TEST(ThreadPoolTest, RunsClosuresConcurrently) {
  // State the closures touch outlives the pool (declared first, destroyed
  // after the pool's destructor has joined its workers).
  absl::Notification first_started;
  absl::Notification second_ran;
  ThreadPool pool(2);
  pool.Schedule("a", [&] {
    first_started.Notify();
    // Only finishes if another worker runs the second closure meanwhile.
    second_ran.WaitForNotification();
  });
  first_started.WaitForNotification();
  pool.Schedule("b", [&] { second_ran.Notify(); });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(ThreadPoolTest, NonPositiveSizeStillGetsOneWorker) {
  absl::Notification ran;
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  pool.Schedule([&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(ThreadPoolTest, OneKeyNeverHoldsEveryWorker) {
  absl::Notification release;
  std::atomic<int> heavy_running{0};
  std::atomic<int> heavy_peak{0};
  absl::Notification light_ran;
  ThreadPool pool(3);  // at most 2 closures of one key at once
  EXPECT_EQ(pool.max_running_per_key(), 2);
  for (int i = 0; i < 10; ++i) {
    pool.Schedule("heavy", [&] {
      const int now = heavy_running.fetch_add(1) + 1;
      int peak = heavy_peak.load();
      while (now > peak && !heavy_peak.compare_exchange_weak(peak, now)) {
      }
      release.WaitForNotification();
      heavy_running.fetch_sub(1);
    });
  }
  // Ten heavy closures are queued ahead, yet the light one runs now.
  pool.Schedule("light", [&] { light_ran.Notify(); });
  EXPECT_TRUE(light_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  release.Notify();
  // (The destructor runs the rest.)
  EXPECT_LE(heavy_peak.load(), 2);
}

TEST(ThreadPoolTest, KeysAreServedRoundRobin) {
  absl::Notification gate;
  absl::Mutex mu;
  std::vector<std::string> order;
  ThreadPool pool(1);
  pool.Schedule("gate", [&] { gate.WaitForNotification(); });
  auto record = [&](std::string what) {
    return [&mu, &order, what] {
      absl::MutexLock lock(&mu);
      order.push_back(what);
    };
  };
  for (int i = 0; i < 3; ++i) pool.Schedule("a", record("a"));
  for (int i = 0; i < 3; ++i) pool.Schedule("b", record("b"));
  pool.Schedule("c", record("c"));
  gate.Notify();
  for (int spins = 0; spins < 3000; ++spins) {
    {
      absl::MutexLock lock(&mu);
      if (order.size() == 7) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order,
            (std::vector<std::string>{"a", "b", "c", "a", "b", "a", "b"}));
}

TEST(ThreadPoolTest, TryScheduleRefusesAFullQueue) {
  ThreadPool::Options options;
  options.threads = 1;
  options.max_queued_per_key = 2;
  absl::Notification started;
  absl::Notification gate;
  std::atomic<int> ran{0};
  ThreadPool pool(options);
  pool.Schedule("x", [&] {
    started.Notify();
    gate.WaitForNotification();
  });
  started.WaitForNotification();
  // The running closure does not count; two may wait.
  EXPECT_TRUE(pool.TrySchedule("x", [&] { ran.fetch_add(1); }));
  EXPECT_TRUE(pool.TrySchedule("x", [&] { ran.fetch_add(1); }));
  EXPECT_FALSE(pool.TrySchedule("x", [&] { ran.fetch_add(100); }));
  // Other keys have queues of their own; Schedule is never refused.
  EXPECT_TRUE(pool.TrySchedule("y", [&] { ran.fetch_add(1); }));
  pool.Schedule("x", [&] { ran.fetch_add(1); });
  gate.Notify();
  for (int spins = 0; spins < 3000 && ran.load() < 4; ++spins) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ran.load(), 4);
}

}  // namespace
}  // namespace materializer
