#include "server/memory/shm_pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace materializer::memory {
namespace {

constexpr uint64_t kSlab = uint64_t{1} << 20;

// A directory of its own under /dev/shm (tmpfs, as in production).
class ShmPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/dev/shm/shm_pool_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr) << std::strerror(errno);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& name : Files()) unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    DIR* listing = opendir(dir_.c_str());
    if (listing == nullptr) return out;
    while (const dirent* e = readdir(listing)) {
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    }
    closedir(listing);
    return out;
  }
  SharedMemoryPool::Options Options(uint64_t slabs) const {
    SharedMemoryPool::Options options;
    options.target_bytes = slabs * kSlab;
    options.slab_bytes = kSlab;
    options.dir = dir_;
    options.quiet = absl::ZeroDuration();
    return options;
  }
  std::string dir_;
};

uint64_t ResidentPages(const std::byte* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<std::byte*>(p), bytes, in_core.data()) != 0) return 0;
  uint64_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

bool AllZero(const std::byte* p, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != std::byte{0}) return false;
  }
  return true;
}

// Idle, the pool fills to its target: files of one slab each, 0600,
// resident, zero; what Take hands out is replaced.
TEST_F(ShmPoolTest, FillsToItsTargetWithResidentZeroSlabs) {
  SharedMemoryPool pool(Options(4));
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  EXPECT_EQ(pool.stats().bytes, 4 * kSlab);
  EXPECT_EQ(Files().size(), 4u);
  for (const std::string& name : Files()) {
    struct stat st;
    ASSERT_EQ(stat((dir_ + "/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), kSlab) << name;
    EXPECT_EQ(name.rfind("materializer-", 0), 0u) << name;
  }

  std::vector<SharedMemorySlab> slabs = pool.Take(3);
  ASSERT_EQ(slabs.size(), 3u);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (SharedMemorySlab& slab : slabs) {
    EXPECT_EQ(slab.bytes, kSlab);
    EXPECT_EQ(ResidentPages(slab.pages, slab.bytes), kSlab / page);
    EXPECT_TRUE(AllZero(slab.pages, slab.bytes));
  }
  EXPECT_EQ(pool.stats().taken_bytes_total, 3 * kSlab);
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  EXPECT_EQ(pool.stats().bytes, 4 * kSlab);
  EXPECT_EQ(pool.stats().filled_bytes_total, 7 * kSlab);
  EXPECT_EQ(Files().size(), 7u);  // 4 in the pool, 3 held here
  for (SharedMemorySlab& slab : slabs) ReleaseSlab(slab);
  EXPECT_EQ(Files().size(), 4u);
}

// A slab goes to one holder, once: what a holder wrote is never handed to
// the next one, and no file comes back.
TEST_F(ShmPoolTest, ASlabIsNeverHandedOutTwice) {
  SharedMemoryPool pool(Options(2));
  std::set<std::string> seen;
  for (int round = 0; round < 4; ++round) {
    ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
    std::vector<SharedMemorySlab> slabs = pool.Take(5);
    ASSERT_EQ(slabs.size(), 2u);  // no more than it holds
    for (SharedMemorySlab& slab : slabs) {
      EXPECT_TRUE(seen.insert(slab.path).second) << slab.path;
      EXPECT_TRUE(AllZero(slab.pages, slab.bytes)) << "round " << round;
      std::memset(slab.pages, 0xA5, slab.bytes);  // a client's bytes
      ReleaseSlab(slab);
    }
  }
}

// While a request is active, and for `quiet` after it, the refill makes
// nothing resident; then it fills the pool again.
TEST_F(ShmPoolTest, RefillWaitsUntilRequestsHaveBeenQuiet) {
  SharedMemoryPool::Options options = Options(2);
  options.quiet = absl::Seconds(1);
  SharedMemoryPool pool(options);
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  absl::Time released;
  {
    SharedMemoryPool::Active active = pool.MarkActive();
    std::vector<SharedMemorySlab> slabs = pool.Take(2);
    for (SharedMemorySlab& slab : slabs) ReleaseSlab(slab);
    absl::SleepFor(absl::Milliseconds(1500));  // past quiet, still active
    EXPECT_EQ(pool.stats().bytes, 0u);
    EXPECT_EQ(pool.stats().filled_bytes_total, 2 * kSlab);
    released = absl::Now();
  }
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  EXPECT_GE(absl::Now() - released, absl::Seconds(1));
  EXPECT_EQ(pool.stats().filled_bytes_total, 4 * kSlab);
}

// The pool's files go with it.
TEST_F(ShmPoolTest, DestroyingThePoolRemovesItsFiles) {
  {
    SharedMemoryPool pool(Options(3));
    ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
    EXPECT_EQ(Files().size(), 3u);
  }
  EXPECT_TRUE(Files().empty());
}

// A directory where no file can be made: the pool stays empty, says why,
// and Take hands out nothing (callers fall back to fresh pages).
TEST_F(ShmPoolTest, ARefillThatFailsIsReportedNotFatal) {
  SharedMemoryPool::Options options = Options(2);
  options.dir = dir_ + "/missing";
  SharedMemoryPool pool(options);
  EXPECT_FALSE(pool.WaitUntilFull(absl::Milliseconds(300)));
  const SharedMemoryPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.bytes, 0u);
  EXPECT_NE(stats.last_error.find("missing"), std::string::npos)
      << stats.last_error;
  EXPECT_TRUE(pool.Take(2).empty());
}

// A target under one slab is no pool: nothing is made.
TEST_F(ShmPoolTest, ATargetUnderOneSlabMakesNothing) {
  SharedMemoryPool::Options options = Options(0);
  options.target_bytes = kSlab - 1;
  SharedMemoryPool pool(options);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(pool.stats().bytes, 0u);
  EXPECT_TRUE(pool.Take(1).empty());
}

// Polls `done` until it holds or `timeout` passes.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

SharedMemoryPool::Options Adaptive(SharedMemoryPool::Options options) {
  options.adaptive = true;
  options.quiet = absl::Milliseconds(100);
  return options;
}

void TakeAndRelease(SharedMemoryPool& pool, size_t count) {
  std::vector<SharedMemorySlab> slabs = pool.Take(count);
  for (SharedMemorySlab& slab : slabs) ReleaseSlab(slab);
}

// An adaptive pool starts empty and keeps what the largest burst of Takes
// asked for (what it could not give included); a smaller burst later does
// not shrink it.
TEST_F(ShmPoolTest, AdaptivePoolKeepsWhatTheLargestBurstAskedFor) {
  SharedMemoryPool pool(Adaptive(Options(8)));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(pool.stats().target_bytes, 0u);
  EXPECT_EQ(pool.stats().max_bytes, 8 * kSlab);
  EXPECT_TRUE(pool.stats().adaptive);
  {
    SharedMemoryPool::Active busy = pool.MarkActive();
    EXPECT_TRUE(pool.Take(3).empty());  // two exports of one burst
    EXPECT_TRUE(pool.Take(2).empty());
  }
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  EXPECT_EQ(pool.stats().bytes, 5 * kSlab);
  EXPECT_EQ(pool.stats().target_bytes, 5 * kSlab);
  EXPECT_EQ(Files().size(), 5u);
  {
    SharedMemoryPool::Active busy = pool.MarkActive();
    TakeAndRelease(pool, 2);
  }
  ASSERT_TRUE(Eventually([&] { return pool.stats().bytes == 5 * kSlab; },
                         absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(pool.stats().target_bytes, 5 * kSlab);
  EXPECT_EQ(pool.stats().bytes, 5 * kSlab);
  EXPECT_EQ(pool.stats().filled_bytes_total, 7 * kSlab);
}

// What it learns stops at target_bytes.
TEST_F(ShmPoolTest, AdaptivePoolStopsAtItsCap) {
  SharedMemoryPool pool(Adaptive(Options(3)));
  TakeAndRelease(pool, 10);
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(pool.stats().bytes, 3 * kSlab);
  EXPECT_EQ(pool.stats().target_bytes, 3 * kSlab);
  EXPECT_EQ(Files().size(), 3u);
}

// Unused for release_after, the adaptive pool frees every slab and
// forgets its target: nothing is refilled until exports come back.
TEST_F(ShmPoolTest, AdaptivePoolFreesItsMemoryWhenUnused) {
  SharedMemoryPool::Options options = Adaptive(Options(8));
  options.release_after = absl::Seconds(1);
  SharedMemoryPool pool(options);
  TakeAndRelease(pool, 2);
  ASSERT_TRUE(pool.WaitUntilFull(absl::Seconds(30)));
  EXPECT_EQ(Files().size(), 2u);
  ASSERT_TRUE(Eventually([&] { return pool.stats().bytes == 0; },
                         absl::Seconds(10)));
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(pool.stats().target_bytes, 0u);
  EXPECT_EQ(pool.stats().trimmed_bytes_total, 2 * kSlab);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(pool.stats().filled_bytes_total, 2 * kSlab);
}

// The pool fills only within the headroom (the host memory no client
// holds), and Trim gives slabs back when a reservation takes that room,
// keeping the ones the reservation is about to take.
TEST_F(ShmPoolTest, HeadroomBoundsThePoolAndTrimMakesRoom) {
  std::atomic<uint64_t> headroom{3 * kSlab};
  SharedMemoryPool::Options options = Options(6);
  options.headroom = [&headroom] { return headroom.load(); };
  SharedMemoryPool pool(options);
  ASSERT_TRUE(Eventually([&] { return pool.stats().bytes == 3 * kSlab; },
                         absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(800));  // past a headroom poll
  EXPECT_EQ(pool.stats().bytes, 3 * kSlab);
  EXPECT_EQ(Files().size(), 3u);

  headroom = 1 * kSlab;  // a client reserved two slabs' worth elsewhere
  pool.Trim(/*taking=*/0);
  EXPECT_EQ(pool.stats().bytes, 1 * kSlab);
  EXPECT_EQ(Files().size(), 1u);
  EXPECT_EQ(pool.stats().trimmed_bytes_total, 2 * kSlab);

  headroom = 0;  // ...and one more for an export that takes the last slab
  pool.Trim(/*taking=*/kSlab);
  EXPECT_EQ(pool.stats().bytes, 1 * kSlab);
  std::vector<SharedMemorySlab> taken = pool.Take(1);
  EXPECT_EQ(taken.size(), 1u);
  for (SharedMemorySlab& slab : taken) ReleaseSlab(slab);

  headroom = 5 * kSlab;  // released
  ASSERT_TRUE(Eventually([&] { return pool.stats().bytes == 5 * kSlab; },
                         absl::Seconds(30)));
}

}  // namespace
}  // namespace materializer::memory
