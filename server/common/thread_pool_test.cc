#include "server/common/thread_pool.h"

#include <atomic>

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
  ThreadPool pool(2);
  absl::Notification first_started;
  absl::Notification second_ran;
  pool.Schedule([&] {
    first_started.Notify();
    // Only finishes if another worker runs the second closure meanwhile.
    second_ran.WaitForNotification();
  });
  first_started.WaitForNotification();
  pool.Schedule([&] { second_ran.Notify(); });
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(ThreadPoolTest, NonPositiveSizeStillGetsOneWorker) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  absl::Notification ran;
  pool.Schedule([&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

}  // namespace
}  // namespace materializer
