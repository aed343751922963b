#include "server/init/seed.h"

#include "gtest/gtest.h"

namespace materializer::init {
namespace {

TEST(SeedTest, Fnv1a64KnownAnswers) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(SeedTest, SplitMix64KnownAnswer) {
  // First output of SplitMix64 seeded with 0.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
}

TEST(SeedTest, DeriveSeedDependsOnSeedAndNameOnly) {
  EXPECT_EQ(DeriveSeed(42, "w"), DeriveSeed(42, "w"));
  EXPECT_NE(DeriveSeed(42, "w"), DeriveSeed(43, "w"));
  EXPECT_NE(DeriveSeed(42, "w"), DeriveSeed(42, "b"));
  EXPECT_EQ(DeriveSeed(7, "h.0.attn.c_attn.weight"),
            SplitMix64(7 ^ SplitMix64(Fnv1a64("h.0.attn.c_attn.weight"))));
}

}  // namespace
}  // namespace materializer::init
