#include "server/load/range_cache.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::load {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

// A file in memory that counts its reads and can be "rewritten" (Check
// fails from then on).
class StringFile : public FileSource {
 public:
  StringFile(std::string bytes, uint64_t inode)
      : bytes_(std::move(bytes)), label_("models/test.safetensors") {
    key_.inode = inode;
    key_.size = bytes_.size();
  }
  const FileKey& key() const override { return key_; }
  const std::string& label() const override { return label_; }
  absl::Status ReadAt(uint64_t offset, uint64_t length,
                      void* dst) const override {
    reads_.fetch_add(1);
    if (gate_ != nullptr) gate_->WaitForNotification();
    bytes_.copy(static_cast<char*>(dst), length, offset);
    return absl::OkStatus();
  }
  absl::Status Check() const override {
    if (changed_.load()) {
      return absl::FailedPreconditionError(
          label_ + " changed on disk while being read");
    }
    return absl::OkStatus();
  }
  int reads() const { return reads_.load(); }
  void set_changed(bool changed) { changed_.store(changed); }
  void set_gate(absl::Notification* gate) { gate_ = gate; }

 private:
  std::string bytes_;
  std::string label_;
  FileKey key_;
  mutable std::atomic<int> reads_{0};
  std::atomic<bool> changed_{false};
  absl::Notification* gate_ = nullptr;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) % 251);
  return s;
}

TEST(RangeCacheTest, ReadsAnyRangeAcrossBlocks) {
  const std::string bytes = Pattern(10000);
  StringFile file(bytes, 1);
  RangeCache cache({.capacity_bytes = 1 << 20, .block_bytes = 1024});
  RangeCache::Counters counters;
  std::string out(3000, '\0');
  ASSERT_THAT(cache.Read(file, 1500, 3000, out.data(), &counters), IsOk());
  EXPECT_EQ(out, bytes.substr(1500, 3000));
  // Blocks 1..4 were read whole.
  EXPECT_EQ(counters.bytes_read_from_files, 4 * 1024u);
  EXPECT_EQ(counters.bytes_from_cache, 0u);
  // The same blocks again: from the cache, no file read.
  RangeCache::Counters again;
  std::string tail(10000 - 2048, '\0');
  ASSERT_THAT(cache.Read(file, 2048, tail.size(), tail.data(), &again), IsOk());
  EXPECT_EQ(tail, bytes.substr(2048));
  EXPECT_EQ(again.bytes_from_cache, 3 * 1024u);
  // Blocks 5..9, the last one short (10000 - 9216 = 784 bytes).
  EXPECT_EQ(again.bytes_read_from_files, 4 * 1024u + 784u);
  EXPECT_EQ(cache.stats().bytes_read_from_files, 8 * 1024u + 784u);
  EXPECT_EQ(cache.stats().cached_bytes, 8 * 1024u + 784u);
}

TEST(RangeCacheTest, RefusesRangesPastTheEnd) {
  StringFile file(Pattern(100), 1);
  RangeCache cache({.capacity_bytes = 1 << 20, .block_bytes = 64});
  RangeCache::Counters counters;
  std::string out(100, '\0');
  EXPECT_THAT(cache.Read(file, 50, 51, out.data(), &counters),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("models/test.safetensors")));
  EXPECT_EQ(file.reads(), 0);
}

TEST(RangeCacheTest, ConcurrentReadersOfOneBlockShareOneRead) {
  const std::string bytes = Pattern(4096);
  StringFile file(bytes, 1);
  absl::Notification gate;
  file.set_gate(&gate);
  RangeCache cache({.capacity_bytes = 1 << 20, .block_bytes = 4096});
  constexpr int kReaders = 8;
  std::vector<std::string> outs(kReaders, std::string(4096, '\0'));
  std::vector<RangeCache::Counters> counters(kReaders);
  std::vector<absl::Status> statuses(kReaders);
  std::vector<std::thread> threads;
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      statuses[r] =
          cache.Read(file, 0, 4096, outs[r].data(), &counters[r]);
    });
  }
  // Let every reader reach the cache while the first read is held.
  while (file.reads() == 0) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(50));
  gate.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(file.reads(), 1);
  uint64_t from_files = 0, from_cache = 0;
  for (int r = 0; r < kReaders; ++r) {
    EXPECT_THAT(statuses[r], IsOk());
    EXPECT_EQ(outs[r], bytes);
    from_files += counters[r].bytes_read_from_files;
    from_cache += counters[r].bytes_from_cache;
  }
  EXPECT_EQ(from_files, 4096u);
  EXPECT_EQ(from_cache, (kReaders - 1) * 4096u);
}

TEST(RangeCacheTest, EvictsLeastRecentlyUsedBeyondCapacity) {
  const std::string bytes = Pattern(4 * 1024);
  StringFile file(bytes, 1);
  RangeCache cache({.capacity_bytes = 2 * 1024, .block_bytes = 1024});
  RangeCache::Counters counters;
  std::string out(1024, '\0');
  ASSERT_THAT(cache.Read(file, 0, 1024, out.data(), &counters), IsOk());
  ASSERT_THAT(cache.Read(file, 1024, 1024, out.data(), &counters), IsOk());
  ASSERT_THAT(cache.Read(file, 0, 1024, out.data(), &counters), IsOk());  // 0 recent
  ASSERT_THAT(cache.Read(file, 2048, 1024, out.data(), &counters), IsOk());  // evicts 1
  EXPECT_EQ(cache.stats().cached_bytes, 2 * 1024u);
  EXPECT_EQ(cache.stats().evicted_bytes, 1024u);
  const int before = file.reads();
  ASSERT_THAT(cache.Read(file, 0, 1024, out.data(), &counters), IsOk());
  EXPECT_EQ(file.reads(), before);  // block 0 was kept
  ASSERT_THAT(cache.Read(file, 1024, 1024, out.data(), &counters), IsOk());
  EXPECT_EQ(file.reads(), before + 1);  // block 1 was not
  EXPECT_EQ(out, bytes.substr(1024, 1024));
}

TEST(RangeCacheTest, ZeroCapacityKeepsNothing) {
  StringFile file(Pattern(2048), 1);
  RangeCache cache({.capacity_bytes = 0, .block_bytes = 1024});
  RangeCache::Counters counters;
  std::string out(2048, '\0');
  ASSERT_THAT(cache.Read(file, 0, 2048, out.data(), &counters), IsOk());
  ASSERT_THAT(cache.Read(file, 0, 2048, out.data(), &counters), IsOk());
  EXPECT_EQ(file.reads(), 4);
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
}

TEST(RangeCacheTest, AFileChangedDuringAReadIsRefusedAndNotKept) {
  StringFile file(Pattern(2048), 1);
  RangeCache cache({.capacity_bytes = 1 << 20, .block_bytes = 1024});
  RangeCache::Counters counters;
  std::string out(2048, '\0');
  file.set_changed(true);
  EXPECT_THAT(cache.Read(file, 0, 2048, out.data(), &counters),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("changed on disk")));
  EXPECT_EQ(cache.stats().cached_bytes, 0u);
  EXPECT_EQ(counters.bytes_read_from_files, 0u);
  // The same file seen again unchanged is read afresh, not from a kept
  // block of the failed read.
  file.set_changed(false);
  const int before = file.reads();
  ASSERT_THAT(cache.Read(file, 0, 1024, out.data(), &counters), IsOk());
  EXPECT_EQ(file.reads(), before + 1);
}

TEST(RangeCacheTest, ADifferentFileIdentityNeverSharesBlocks) {
  StringFile old_file(Pattern(1024), 1);
  std::string other = Pattern(1024);
  other[0] ^= 1;
  StringFile new_file(other, 2);  // same path rewritten: another inode
  RangeCache cache({.capacity_bytes = 1 << 20, .block_bytes = 1024});
  RangeCache::Counters counters;
  std::string out(1024, '\0');
  ASSERT_THAT(cache.Read(old_file, 0, 1024, out.data(), &counters), IsOk());
  ASSERT_THAT(cache.Read(new_file, 0, 1024, out.data(), &counters), IsOk());
  EXPECT_EQ(out, other);
}

}  // namespace
}  // namespace materializer::load
