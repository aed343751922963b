#include "server/common/log.h"

#include <string>
#include <vector>

#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::log {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

std::vector<std::string>* captured = nullptr;

void Capture(absl::string_view line) { captured->emplace_back(line); }

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    captured = &lines_;
    internal::SetWriterForTest(&Capture);
    SetMinLevel(Level::kInfo);
  }
  void TearDown() override {
    internal::SetWriterForTest(nullptr);
    SetFormat(Format::kText);
    captured = nullptr;
  }
  std::vector<std::string> lines_;
};

TEST(JsonQuoteTest, EscapesQuotesControlsAndBadUtf8) {
  EXPECT_EQ(internal::JsonQuote("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(internal::JsonQuote("x\ny\t\x01"), R"("x\ny\t\u0001")");
  // Valid multi-byte UTF-8 passes through; a lone continuation byte, a
  // truncated sequence and an overlong '/' do not.
  EXPECT_EQ(internal::JsonQuote("\xc3\xa9"), "\"\xc3\xa9\"");
  EXPECT_EQ(internal::JsonQuote("a\x80z"), R"("a\ufffdz")");
  EXPECT_EQ(internal::JsonQuote("\xe2\x82"), R"("\ufffd\ufffd")");
  EXPECT_EQ(internal::JsonQuote("\xc0\xaf"), R"("\ufffd\ufffd")");
}

TEST(Rfc3339Test, HasDateTimeMicrosecondsAndZoneOffset) {
  const absl::Time t = absl::FromCivil(
      absl::CivilSecond(2024, 11, 30, 4, 46, 48), absl::LocalTimeZone()) +
      absl::Microseconds(123456);
  const std::string text = internal::Rfc3339(t);
  EXPECT_THAT(text, MatchesRegex(
      "2024-11-30T04:46:48\\.123456[+-][0-9][0-9]:[0-9][0-9]"));
}

TEST_F(LogTest, TextEventQuotesOnlyWhatNeedsIt) {
  MLOG_EVENT(INFO, "rpc")
      .Str("method", "Plan")
      .Str("error", "two words")
      .Str("empty", "")
      .Uint("bytes", 42)
      .Bool("ok", true)
      .Millis("duration_ms", absl::Microseconds(1500))
      .List("handles", {"h-1", "h-2"});
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_THAT(lines_[0], StartsWith("I"));
  EXPECT_THAT(lines_[0],
              HasSubstr("] rpc method=Plan error=\"two words\" empty=\"\" "
                        "bytes=42 ok=true duration_ms=1.500 "
                        "handles=h-1,h-2\n"));
}

TEST_F(LogTest, JsonLinesCarryTimeLevelSourceAndFields) {
  SetFormat(Format::kJson);
  MLOG(WARNING) << "plain \"text\"";
  MLOG_EVENT(INFO, "fetch_end").Uint("bytes", 7).List("handles", {});
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_THAT(lines_[0],
              MatchesRegex("\\{\"time\":\"[0-9T:.+-]+\",\"level\":\"warning\","
                           "\"source\":\"log_test.cc:[0-9]+\","
                           "\"msg\":\"plain \\\\\"text\\\\\"\"\\}\n"));
  EXPECT_THAT(lines_[1],
              MatchesRegex("\\{\"time\":\"[0-9T:.+-]+\",\"level\":\"info\","
                           "\"source\":\"log_test.cc:[0-9]+\","
                           "\"event\":\"fetch_end\",\"bytes\":7,"
                           "\"handles\":\\[\\]\\}\n"));
}

TEST_F(LogTest, LinesBelowTheLevelAreNotFormatted) {
  SetMinLevel(Level::kWarning);
  bool evaluated = false;
  auto touch = [&] {
    evaluated = true;
    return "x";
  };
  MLOG(INFO) << touch();
  MLOG_EVENT(INFO, "rpc").Str("k", touch());
  EXPECT_TRUE(lines_.empty());
  EXPECT_FALSE(evaluated);
  MLOG(ERROR) << "shown";
  EXPECT_EQ(lines_.size(), 1u);
  EXPECT_THAT(lines_[0], Not(HasSubstr("rpc")));
}

TEST(ParseFormatTest, TextAndJsonOnly) {
  Format format = Format::kText;
  EXPECT_TRUE(ParseFormat("json", &format));
  EXPECT_EQ(format, Format::kJson);
  EXPECT_TRUE(ParseFormat("TEXT", &format));
  EXPECT_EQ(format, Format::kText);
  EXPECT_FALSE(ParseFormat("yaml", &format));
}

}  // namespace
}  // namespace materializer::log
