#include "server/init/portable/philox.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace materializer::init::portable {
namespace {

// Known-answer vectors from Random123's examples/kat_vectors (D. E. Shaw
// Research), as cut and pasted into DEShawResearch/Random123-Boost,
// libs/random/test/test_philox.cpp (commit 916db91a): counter (4 words),
// key (2 words), expected output (4 words), for 7 and 10 rounds. The last
// of each is the digits of pi.
struct Kat {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

constexpr Kat kKat10[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

constexpr Kat kKat7[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
};

template <int kRounds>
void ExpectKat(const Kat& kat) {
  uint32_t x[4] = {kat.counter[0], kat.counter[1], kat.counter[2],
                   kat.counter[3]};
  Philox4x32<kRounds>(x[0], x[1], x[2], x[3], kat.key[0], kat.key[1]);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(x[i], kat.expected[i])
        << "rounds " << kRounds << " word " << i << " counter " << std::hex
        << kat.counter[0];
  }
}

TEST(PhiloxTest, Random123KnownAnswers10Rounds) {
  for (const Kat& kat : kKat10) ExpectKat<10>(kat);
}

TEST(PhiloxTest, Random123KnownAnswers7Rounds) {
  for (const Kat& kat : kKat7) ExpectKat<7>(kat);
}

TEST(PhiloxTest, ConvenienceFormIsTenRounds) {
  const Kat& kat = kKat10[2];
  PhiloxWords words = {
      {kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3]}};
  words = Philox4x32_10(words, kat.key[0], kat.key[1]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(words.v[i], kat.expected[i]);
}

}  // namespace
}  // namespace materializer::init::portable
