#include "server/common/units.h"

#include "gtest/gtest.h"

namespace materializer {
namespace {

TEST(ParseBytesTest, AcceptsPlainAndSuffixedCounts) {
  EXPECT_EQ(ParseBytes("0").value(), 0u);
  EXPECT_EQ(ParseBytes("1048576").value(), 1048576u);
  EXPECT_EQ(ParseBytes("64KiB").value(), 65536u);
  EXPECT_EQ(ParseBytes("512MiB").value(), 536870912u);
  EXPECT_EQ(ParseBytes("16GiB").value(), 17179869184u);
  EXPECT_EQ(ParseBytes("16g").value(), 17179869184u);
  EXPECT_EQ(ParseBytes("1.5GB").value(), 1500000000u);
  EXPECT_EQ(ParseBytes(" 2 MB ").value(), 2000000u);
  EXPECT_EQ(ParseBytes("18446744073709551614").value(),
            18446744073709551614u);
}

TEST(ParseBytesTest, RejectsGarbageAndOverflow) {
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("12 parsecs").ok());
  EXPECT_FALSE(ParseBytes("-5").ok());
  EXPECT_FALSE(ParseBytes("99999999TiB").ok());
}

TEST(FormatBytesTest, UsesBinaryUnits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536 * 1024), "1.50 MiB");
  EXPECT_EQ(FormatBytes(17179869184u), "16.00 GiB");
}

}  // namespace
}  // namespace materializer
