#include "server/delivery/digest.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace materializer::delivery {
namespace {

std::string Pattern() {
  std::string out;
  for (int i = 0; i < 40; ++i) {
    for (int b = 0; b < 256; ++b) out.push_back(static_cast<char>(b));
  }
  return out;
}

// 3 MiB of xorshift noise from `seed`.
std::string NoiseBytes(uint64_t seed) {
  std::string data(3 << 20, '\0');
  uint64_t x = seed;
  for (char& c : data) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return data;
}

// Every byte count from 0 to 2,100 (XXH3 has separate paths up to 16, 128,
// 240 bytes and per 1 KiB stripe block), then `large` ones.
std::vector<size_t> LengthsToCheck(std::initializer_list<size_t> large) {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 2100; ++n) sizes.push_back(n);
  sizes.insert(sizes.end(), large);
  return sizes;
}

// Expected values from Python: xxhash.xxh3_128(data).hexdigest() and
// zlib.crc32(data).
TEST(DigestTest, MatchesPythonXxhash) {
  EXPECT_EQ(FormatDigest(HashBytes("", 0)),
            "xxh3-128:99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(FormatDigest(HashBytes("abc", 3)),
            "xxh3-128:06b05ab6733a618578af5f94892f3950");
  const std::string pattern = Pattern();
  EXPECT_EQ(FormatDigest(HashBytes(pattern.data(), pattern.size())),
            "xxh3-128:1cb22534d0d96975c03d2231ab9348f3");
}

TEST(DigestTest, StreamingEqualsOneShotForAnySplit) {
  const std::string pattern = Pattern();
  const Digest128 whole = HashBytes(pattern.data(), pattern.size());
  for (size_t split : {size_t{0}, size_t{1}, size_t{239}, size_t{240},
                       size_t{4096}, pattern.size()}) {
    Hasher hasher;
    hasher.Update(pattern.data(), split);
    hasher.Update(pattern.data() + split, pattern.size() - split);
    EXPECT_EQ(hasher.Finish(), whole) << split;
    EXPECT_EQ(hasher.length(), pattern.size());
  }
}

TEST(DigestTest, MovedHasherKeepsItsState) {
  Hasher a;
  a.Update("ab", 2);
  Hasher b = std::move(a);
  b.Update("c", 1);
  EXPECT_EQ(b.Finish(), HashBytes("abc", 3));
}

// Every byte count from 0 to 2,100 (XXH3 has separate paths up to 16, 128,
// 240 bytes and per 1 KiB stripe block), some large ones, at unaligned
// starts, one-shot and streamed in uneven pieces: the kernel this process
// uses gives libxxhash's digests.
TEST(DigestTest, ActiveKernelMatchesTheSystemLibrary) {
  const std::string data = NoiseBytes(0x9E3779B97F4A7C15u);
  const std::vector<size_t> sizes =
      LengthsToCheck({4095, 65536, 65537, 1 << 20, (2 << 20) + 13});
  for (size_t n : sizes) {
    const char* start = data.data() + (n % 61);
    const Digest128 want = HashBytesWithSystemLibrary(start, n);
    ASSERT_EQ(HashBytes(start, n), want) << n;
    Hasher hasher;
    for (size_t at = 0, step = 1; at < n; step = step * 3 + 1) {
      const size_t k = std::min(step, n - at);
      hasher.Update(start + at, k);
      at += k;
    }
    ASSERT_EQ(hasher.Finish(), want) << n;
  }
}

// The widest build the CPU runs must be the one in use (a build that lost
// its -m flag falls back silently otherwise).
TEST(DigestTest, UsesTheWidestBuildTheCpuRuns) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(ActiveHashKernel(), HashKernel::kAvx512);
  } else if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(ActiveHashKernel(), HashKernel::kAvx2);
  } else {
    EXPECT_EQ(ActiveHashKernel(), HashKernel::kSystem);
  }
#else
  EXPECT_EQ(ActiveHashKernel(), HashKernel::kSystem);
#endif
}

// Every vector build the CPU runs, not only the active one, gives
// libxxhash's digests: one-shot and streamed, every length to 2,100 bytes
// (XXH3's short-input paths) and some large ones, at unaligned starts.
TEST(DigestTest, EveryBuildTheCpuRunsMatchesTheSystemLibrary) {
  const std::string data = NoiseBytes(0x2545F4914F6CDD1Du);
  const std::vector<size_t> sizes = LengthsToCheck({65537, (2 << 20) + 13});
  int builds = 0;
  for (HashKernel kind : {HashKernel::kAvx2, HashKernel::kAvx512}) {
    if (!HashKernelRuns(kind)) continue;
    ++builds;
    for (size_t n : sizes) {
      const char* start = data.data() + (n % 61);
      const Digest128 want = HashBytesWithSystemLibrary(start, n);
      ASSERT_EQ(HashBytesWithKernel(kind, start, n), want)
          << static_cast<int>(kind) << " " << n;
      ASSERT_EQ(HashBytesWithKernel(kind, start, n, 1 + n % 1000), want)
          << static_cast<int>(kind) << " " << n;
    }
  }
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_GE(builds, 1);
  }
#endif
}

TEST(DigestTest, CanonicalBytesAreBigEndianHighFirst) {
  const auto bytes =
      CanonicalBytes(Digest128{0x0102030405060708u, 0x1112131415161718u});
  EXPECT_EQ(bytes[0], 0x01);
  EXPECT_EQ(bytes[7], 0x08);
  EXPECT_EQ(bytes[8], 0x11);
  EXPECT_EQ(bytes[15], 0x18);
}

TEST(Crc32Test, MatchesZlibAndContinues) {
  EXPECT_EQ(Crc32("abc", 3), 0x352441c2u);
  const std::string pattern = Pattern();
  EXPECT_EQ(Crc32(pattern.data(), pattern.size()), 0xbbce3b9du);
  EXPECT_EQ(Crc32(pattern.data() + 100, pattern.size() - 100,
                  Crc32(pattern.data(), 100)),
            0xbbce3b9du);
  EXPECT_EQ(Crc32(nullptr, 0, 0x352441c2u), 0x352441c2u);
}

TEST(Crc32Test, PiecesCombineIntoTheWholesCrc) {
  std::string data;
  for (int i = 0; i < 3 << 20; ++i) data.push_back(static_cast<char>(i * 31 + 7));
  const uint32_t whole = Crc32(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20,
                     data.size() - 1, data.size()}) {
    EXPECT_EQ(Crc32Combine(Crc32(data.data(), cut),
                           Crc32(data.data() + cut, data.size() - cut),
                           data.size() - cut),
              whole)
        << cut;
  }
}

}  // namespace
}  // namespace materializer::delivery
