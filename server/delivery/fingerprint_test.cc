#include "server/delivery/fingerprint.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/init/seed.h"

namespace materializer::delivery {
namespace {

TEST(FingerprintTest, DefinitionOnAFewElements) {
  const std::vector<float> values = {1.5f, -2.0f, 0.0f};
  uint64_t want = 0;
  for (uint64_t g = 0; g < values.size(); ++g) {
    uint32_t bits = 0;
    std::memcpy(&bits, &values[g], 4);
    want += init::SplitMix64(g ^ init::SplitMix64(bits));
  }
  EXPECT_EQ(FingerprintOf(values.data(), 4, {3}), want);
}

TEST(FingerprintTest, ShardsAddUpToTheFullTensorInAnyLayout) {
  // A 7 x 10 int16 tensor with distinct values.
  const int64_t rows = 7, cols = 10;
  std::vector<int16_t> full(rows * cols);
  for (size_t i = 0; i < full.size(); ++i)
    full[i] = static_cast<int16_t>(i * 37 - 100);
  const uint64_t whole = FingerprintOf(full.data(), 2, {rows, cols});

  // 2-D blocks (uneven), fed in pieces of odd sizes.
  uint64_t sum = 0;
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 3}, {3, 7}}) {
    for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, 4}, {4, 10}}) {
      std::vector<int16_t> block;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) block.push_back(full[r * cols + c]);
      }
      Fingerprinter f(2, {r1 - r0, c1 - c0}, {rows, cols}, {r0, c0});
      size_t done = 0;
      for (size_t piece : {size_t{1}, size_t{3}, size_t{5}, block.size()}) {
        const size_t n = std::min(piece, block.size() - done);
        f.Add(block.data() + done, n);
        done += n;
      }
      sum += f.value();
    }
  }
  EXPECT_EQ(sum, whole);
  // Moving a value changes the fingerprint.
  std::vector<int16_t> swapped = full;
  std::swap(swapped[3], swapped[4]);
  EXPECT_NE(FingerprintOf(swapped.data(), 2, {rows, cols}), whole);
}

TEST(FingerprintTest, ScalarsAndEmptyTensors) {
  const double x = 3.25;
  uint64_t bits = 0;
  std::memcpy(&bits, &x, 8);
  EXPECT_EQ(FingerprintOf(&x, 8, {}),
            init::SplitMix64(0 ^ init::SplitMix64(bits)));
  EXPECT_EQ(FingerprintOf(nullptr, 4, {0, 5}), 0u);
}

}  // namespace
}  // namespace materializer::delivery
