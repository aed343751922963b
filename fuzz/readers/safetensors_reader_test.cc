#include "fuzz/readers/safetensors_reader.h"

#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::fuzz {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

// 8-byte little-endian length, then the header as given.
std::string File(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

TEST(SafetensorsReaderTest, ReadsTensorsMetadataAndEscapes) {
  const std::string file = File(
      R"({"__metadata__":{"format":"pt"},"a\"b\\c":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[0,8]},"\u00e9":{"dtype":"BF16","shape":[],)"
      R"("data_offsets":[8,10]}}  )",
      std::string(10, 'x'));
  ASSERT_OK_AND_ASSIGN(SafetensorsContents contents, ReadSafetensors(file));
  ASSERT_EQ(contents.metadata.size(), 1u);
  EXPECT_EQ(contents.metadata[0].second, "pt");
  ASSERT_EQ(contents.tensors.size(), 2u);
  EXPECT_EQ(contents.tensors[0].name, "a\"b\\c");
  EXPECT_EQ(contents.tensors[0].shape, std::vector<uint64_t>{2});
  EXPECT_EQ(contents.tensors[1].name, "\xc3\xa9");
  EXPECT_EQ(contents.tensors[1].dtype, "BF16");
  EXPECT_TRUE(contents.tensors[1].shape.empty());
  EXPECT_EQ(contents.data_start, file.size() - 10);
}

TEST(SafetensorsReaderTest, RefusesWhatTheFormatForbids) {
  const std::string ok_entry =
      R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  struct Case {
    std::string header;
    std::string data;
    std::string reason;
  };
  const Case cases[] = {
      {"{" + ok_entry + "," + ok_entry + "}", "xxxx", "duplicate key"},
      {"{" + ok_entry + "}", "xxxxx", "cover 4 bytes of the 5-byte"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx",
       "hold 4 bytes, but F32 of shape [2] is 8 bytes"},
      {R"({"t":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "xxxx",
       "dtype \"F31\" is unknown"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "xxxxxxxx",
       "leave a gap of 4 bytes"},
      {"{\"a\x01\":{}}", "", "control character"},
      {"{\"\xff\":{}}", "", "invalid UTF-8"},
      {R"({"\ud800":{}})", "", "lone high surrogate"},
      {R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx",
       "non-integer"},
      {"{}x", "", "text after the JSON value"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ReadSafetensors(File(c.header, c.data)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(c.reason)))
        << c.header;
  }
  std::string short_file = File("{}", "");
  short_file[0] = 100;  // header length past the end
  EXPECT_THAT(ReadSafetensors(short_file),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("passes the end")));
}

}  // namespace
}  // namespace materializer::fuzz
