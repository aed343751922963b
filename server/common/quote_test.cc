#include "server/common/quote.h"

#include <string>

#include "gtest/gtest.h"

namespace materializer {
namespace {

TEST(QuoteTest, ShortInputsAreQuotedWhole) {
  EXPECT_EQ(Quote("h-12"), "\"h-12\"");
  EXPECT_EQ(Quote(""), "\"\"");
}

TEST(QuoteTest, ControlBytesAndQuotesAreEscaped) {
  EXPECT_EQ(Quote(std::string("a\"b\\c\n\x01", 7)), "\"a\\\"b\\\\c\\n\\x01\"");
}

TEST(QuoteTest, LongInputsAreCutAndSayTheirLength) {
  const std::string id = "h-" + std::string(1 << 20, '0');
  const std::string quoted = Quote(id);
  EXPECT_EQ(quoted, "\"h-" + std::string(126, '0') + "...\" (1048578 bytes)");
  EXPECT_EQ(Quote("abcdef", 3), "\"abc...\" (6 bytes)");
}

TEST(QuoteTest, BoundedEvenWhenEveryByteNeedsAnEscape) {
  const std::string binary(1 << 20, '\xff');
  EXPECT_LE(Quote(binary).size(), 4 * kMaxQuotedBytes + 32);
}

}  // namespace
}  // namespace materializer
