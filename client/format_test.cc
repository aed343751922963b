#include "client/format.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace materializer::client {
namespace {

TEST(TableTest, PadsColumnsAndRightAlignsNumbers) {
  Table table({"NAME", "BYTES", "INIT"});
  table.SetAlign(1, Table::Align::kRight);
  table.AddRow({"fc.weight", "8.00 KiB", "normal"});
  table.AddRow({"b", "0 B", ""});
  EXPECT_EQ(table.num_rows(), 2u);
  // No trailing spaces, even where the last cell is blank or short.
  EXPECT_EQ(table.Render(),
            "NAME          BYTES  INIT\n"
            "fc.weight  8.00 KiB  normal\n"
            "b               0 B\n");
}

TEST(TableTest, WithoutHeaderIsAKeyValueListing) {
  Table table;
  table.AddRow({"handle", "h-0123"});
  table.AddRow({"arena bytes", "8.00 KiB (8192)"});
  EXPECT_EQ(table.Render(),
            "handle       h-0123\n"
            "arena bytes  8.00 KiB (8192)\n");
}

TEST(TableTest, ShortRowsAndMultibyteCells) {
  Table table({"UNIT", "N"});
  table.SetAlign(1, Table::Align::kRight);
  table.AddRow({"\xC2\xB5s", "5"});  // "µs": two columns, three bytes
  table.AddRow({"ms"});
  table.AddRow({"seconds", "100"});
  EXPECT_EQ(table.Render(),
            "UNIT       N\n"
            "\xC2\xB5s         5\n"
            "ms\n"
            "seconds  100\n");
}

TEST(TableTest, EmptyTableWithoutHeaderRendersNothing) {
  EXPECT_EQ(Table().Render(), "");
}

TEST(FormatTest, DisplayWidthCountsCodePoints) {
  EXPECT_EQ(DisplayWidth(""), 0u);
  EXPECT_EQ(DisplayWidth("abc"), 3u);
  EXPECT_EQ(DisplayWidth("\xC2\xB5s"), 2u);
}

TEST(FormatTest, Shape) {
  EXPECT_EQ(FormatShape({}), "[]");
  EXPECT_EQ(FormatShape({64, 32}), "[64, 32]");
  EXPECT_EQ(FormatShape({0}), "[0]");
}

TEST(FormatTest, Millis) {
  EXPECT_EQ(FormatMillis(0), "0.000");
  EXPECT_EQ(FormatMillis(5), "0.005");
  EXPECT_EQ(FormatMillis(1234), "1.234");
  EXPECT_EQ(FormatMillis(1234567), "1234.567");
}

TEST(FormatTest, Rate) {
  EXPECT_EQ(FormatRate(87300000, absl::Seconds(1)), "87.3 MB/s");
  EXPECT_EQ(FormatRate(3000000, absl::Seconds(2)), "1.5 MB/s");
  EXPECT_EQ(FormatRate(100, absl::ZeroDuration()), "-- MB/s");
}

TEST(FormatTest, EtaRoundsUpToWholeSeconds) {
  EXPECT_EQ(FormatEta(absl::ZeroDuration()), "0:00");
  EXPECT_EQ(FormatEta(absl::Milliseconds(7200)), "0:08");
  EXPECT_EQ(FormatEta(absl::Seconds(725)), "12:05");
  EXPECT_EQ(FormatEta(absl::Seconds(3723)), "1:02:03");
  EXPECT_EQ(FormatEta(absl::Seconds(-3)), "0:00");
}

TEST(ProgressLineTest, HalfwayAtOneMebibytePerSecond) {
  EXPECT_EQ(FormatProgressLine(1048576, 2097152, 1048576, absl::Seconds(1)),
            "[##########----------]  50.0%  1.00 MiB / 2.00 MiB  1.0 MB/s  "
            "ETA 0:01");
}

TEST(ProgressLineTest, RateAndEtaCountOnlyTransferredBytes) {
  // 1 MB was on disk from an earlier attempt; 0.5 MB arrived in 1 s, so the
  // 45 MB left take 90 s.
  EXPECT_EQ(FormatProgressLine(1500000, 46500000, 500000, absl::Seconds(1)),
            "[--------------------]   3.2%  1.43 MiB / 44.35 MiB  0.5 MB/s  "
            "ETA 1:30");
}

TEST(ProgressLineTest, RoundsDownSoOnlyCompleteShowsHundred) {
  EXPECT_EQ(FormatProgressLine(999, 1000, 999, absl::ZeroDuration()),
            "[###################-]  99.9%  999 B / 1000 B  -- MB/s  "
            "ETA --:--");
  EXPECT_EQ(FormatProgressLine(1000, 1000, 1000, absl::Seconds(2)),
            "[####################] 100.0%  1000 B / 1000 B  0.0 MB/s  "
            "ETA 0:00");
}

TEST(ProgressLineTest, EmptyFileIsComplete) {
  EXPECT_EQ(FormatProgressLine(0, 0, 0, absl::Seconds(1)),
            "[####################] 100.0%  0 B / 0 B  0.0 MB/s  ETA 0:00");
}

TEST(FetchSummaryTest, FullAndResumedTransfers) {
  EXPECT_EQ(FormatFetchSummary(2097152, 2097152, absl::Milliseconds(1500)),
            "2097152 bytes (2.00 MiB) in 1.50 s, 1.4 MB/s");
  EXPECT_EQ(FormatFetchSummary(2097152, 1048576, absl::Milliseconds(500)),
            "1048576 bytes (1.00 MiB) in 0.50 s, 2.1 MB/s; resumed at byte "
            "1048576 of 2097152");
}

TEST(ProgressMeterTest, RedrawsAtMostEveryHundredMillisecondsAndAtTheEnd) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  ProgressMeter meter(t0);
  EXPECT_FALSE(meter.started());

  std::optional<std::string> line = meter.Update(0, 2000000, t0);
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(
      *line,
      "[--------------------]   0.0%  0 B / 1.91 MiB  -- MB/s  ETA --:--");

  EXPECT_FALSE(
      meter.Update(500000, 2000000, t0 + absl::Milliseconds(50)).has_value());
  line = meter.Update(1000000, 2000000, t0 + absl::Milliseconds(100));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line,
            "[##########----------]  50.0%  976.56 KiB / 1.91 MiB  10.0 MB/s  "
            "ETA 0:01");

  EXPECT_FALSE(
      meter.Update(1500000, 2000000, t0 + absl::Milliseconds(150)).has_value());
  // Completion draws even right after a redraw.
  line = meter.Update(2000000, 2000000, t0 + absl::Milliseconds(160));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line,
            "[####################] 100.0%  1.91 MiB / 1.91 MiB  12.5 MB/s  "
            "ETA 0:00");
  EXPECT_EQ(meter.done(), 2000000u);
  EXPECT_EQ(meter.total(), 2000000u);
  EXPECT_EQ(meter.transferred(), 2000000u);
}

TEST(ProgressMeterTest, FirstUpdateIsTheResumeBaseline) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  ProgressMeter meter(t0);
  meter.Update(1000000, 3000000, t0);
  const std::optional<std::string> line =
      meter.Update(2000000, 3000000, t0 + absl::Seconds(1));
  ASSERT_TRUE(line.has_value());
  // 1 MB in 1 s, 1 MB left: the rate ignores the bytes already on disk.
  EXPECT_EQ(*line,
            "[#############-------]  66.6%  1.91 MiB / 2.86 MiB  1.0 MB/s  "
            "ETA 0:01");
  EXPECT_EQ(meter.transferred(), 1000000u);
}

TEST(FormatTest, JsonQuoteEscapes) {
  EXPECT_EQ(JsonQuote("h-01"), "\"h-01\"");
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
}

}  // namespace
}  // namespace materializer::client
