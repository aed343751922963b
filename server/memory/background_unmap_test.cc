#include "server/memory/background_unmap.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace materializer::memory {
namespace {

constexpr size_t kBytes = 8 << 20;

void* MapPopulated(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 1, bytes);
  return p;
}

// msync answers ENOMEM for a range that is not (entirely) mapped.
bool Mapped(void* p, size_t bytes) {
  return msync(p, bytes, MS_ASYNC) == 0;
}

TEST(BackgroundUnmapTest, AQueuedRangeIsUnmappedOnceWaitedFor) {
  void* p = MapPopulated(kBytes);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(Mapped(p, kBytes));
  UnmapInBackground(p, kBytes);
  WaitForBackgroundUnmaps();
  EXPECT_FALSE(Mapped(p, kBytes));
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(PendingBackgroundUnmaps(), 0u);
}

TEST(BackgroundUnmapTest, RangesFromManyThreadsAreAllUnmapped) {
  constexpr int kThreads = 4;
  constexpr int kEach = 16;
  std::vector<std::vector<void*>> ranges(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ranges, t] {
      for (int i = 0; i < kEach; ++i) {
        void* p = MapPopulated(1 << 20);
        if (p == nullptr) continue;
        ranges[t].push_back(p);
        UnmapInBackground(p, 1 << 20);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  WaitForBackgroundUnmaps();
  int checked = 0;
  for (const std::vector<void*>& mine : ranges) {
    for (void* p : mine) {
      EXPECT_FALSE(Mapped(p, 1 << 20));
      ++checked;
    }
  }
  EXPECT_EQ(checked, kThreads * kEach);
  EXPECT_EQ(PendingBackgroundUnmaps(), 0u);
}

TEST(BackgroundUnmapTest, NothingQueuedWaitsForNothing) {
  WaitForBackgroundUnmaps();
  UnmapInBackground(nullptr, kBytes);  // ignored
  UnmapInBackground(MapPopulated(4096), 0);  // ignored (and left mapped)
  WaitForBackgroundUnmaps();
  EXPECT_EQ(PendingBackgroundUnmaps(), 0u);
}

}  // namespace
}  // namespace materializer::memory
