#include "server/checkpoint/json.h"

#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

absl::Status Skip(absl::string_view text) {
  JsonReader json(text);
  if (absl::Status s = json.SkipValue(); !s.ok()) return s;
  return json.ExpectEnd();
}

TEST(JsonReaderTest, PullsObjectsArraysAndScalars) {
  JsonReader json(
      R"( {"s": "a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "n": [0, -12, 18446744073709551615, 1.5e3, 18446744073709551616], "t": true, "z": null} )");
  ASSERT_OK(json.BeginObject());
  std::string key;
  ASSERT_OK_AND_ASSIGN(bool more, json.NextMember(&key));
  ASSERT_TRUE(more);
  EXPECT_EQ(key, "s");
  ASSERT_OK_AND_ASSIGN(std::string s, json.ReadString());
  EXPECT_EQ(s, "a\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  ASSERT_OK_AND_ASSIGN(more, json.NextMember(&key));
  EXPECT_EQ(key, "n");
  ASSERT_OK_AND_ASSIGN(JsonReader::Type type, json.Peek());
  EXPECT_EQ(type, JsonReader::Type::kArray);
  ASSERT_OK(json.BeginArray());
  std::vector<JsonNumber> numbers;
  while (true) {
    ASSERT_OK_AND_ASSIGN(more, json.NextElement());
    if (!more) break;
    ASSERT_OK_AND_ASSIGN(JsonNumber n, json.ReadNumber());
    numbers.push_back(n);
  }
  ASSERT_EQ(numbers.size(), 5u);
  EXPECT_TRUE(numbers[0].integer && numbers[0].magnitude == 0);
  EXPECT_TRUE(numbers[1].integer && numbers[1].negative &&
              numbers[1].magnitude == 12);
  EXPECT_TRUE(numbers[2].integer && numbers[2].magnitude == UINT64_MAX);
  EXPECT_FALSE(numbers[3].integer);  // 1.5e3: a number, not an integer
  EXPECT_FALSE(numbers[4].integer);  // 2^64: too large to hold exactly
  ASSERT_OK_AND_ASSIGN(more, json.NextMember(&key));
  EXPECT_EQ(key, "t");
  ASSERT_OK_AND_ASSIGN(bool t, json.ReadBool());
  EXPECT_TRUE(t);
  ASSERT_OK_AND_ASSIGN(more, json.NextMember(&key));
  EXPECT_EQ(key, "z");
  ASSERT_OK(json.ReadNull());
  ASSERT_OK_AND_ASSIGN(more, json.NextMember(&key));
  EXPECT_FALSE(more);
  EXPECT_OK(json.ExpectEnd());
}

TEST(JsonReaderTest, RefusesWhatRfc8259Forbids) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"a": 1, "a": 2})", "duplicate key \"a\""},
      {R"([{"x": {"k": 1, "k": 2}}])", "duplicate key \"k\""},
      {"{\"a\x01\": 1}", "control character"},
      {"\"\xff\"", "invalid UTF-8"},
      {"\"\xc0\xaf\"", "invalid UTF-8"},          // overlong '/'
      {"\"\xed\xa0\x80\"", "invalid UTF-8"},      // an encoded surrogate
      {R"("\ud800")", "lone high surrogate"},
      {R"("\udc00")", "lone low surrogate"},
      {R"("\q")", "unknown escape"},
      {"01", "leading zero"},
      {"1.", "no digits after '.'"},
      {"1e", "no digits in an exponent"},
      {"-", "expected a number"},
      {"[1,]", "expected a value"},
      {"[1 2]", "expected ',' or ']'"},
      {R"({"a" 1})", "expected ':'"},
      {"{1: 2}", "expected a key"},
      {"tru", "expected true or false"},
      {"{} {}", "text after the JSON value"},
      {"[", "found the end"},
      {"\"abc", "unterminated string"},
      {"", "found the end"},
      {std::string(kMaxJsonDepth + 1, '['), "nested deeper than 64"},
  };
  for (const auto& [text, reason] : cases) {
    EXPECT_THAT(Skip(text), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr(reason)))
        << text;
  }
  std::string deep = std::string(kMaxJsonDepth, '[') +
                     std::string(kMaxJsonDepth, ']');
  EXPECT_OK(Skip(deep));
}

TEST(JsonReaderTest, ErrorsSayWhere) {
  EXPECT_THAT(Skip(R"({"a": 1, "a": 2})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("JSON byte 9: duplicate key")));
}

}  // namespace
}  // namespace materializer::checkpoint
