#include "server/common/random_hex.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace materializer {
namespace {

TEST(UnguessableHex128Test, ThirtyTwoHexDigitsNeverRepeated) {
  std::set<std::string> seen;
  int ones = 0;
  for (int i = 0; i < 1000; ++i) {
    const std::string hex = UnguessableHex128();
    ASSERT_EQ(hex.size(), 32u) << hex;
    for (char c : hex) {
      ASSERT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << hex;
      const int digit = c <= '9' ? c - '0' : c - 'a' + 10;
      ones += __builtin_popcount(digit);
    }
    EXPECT_TRUE(seen.insert(hex).second) << "repeated " << hex;
  }
  // 128,000 random bits hold about 64,000 ones (sd 179); a constant or a
  // counter would be far off.
  EXPECT_NEAR(ones, 64000, 2000);
}

}  // namespace
}  // namespace materializer
