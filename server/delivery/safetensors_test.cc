#include "server/delivery/safetensors.h"

#include <cstring>
#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::delivery {
namespace {

using ::materializer::testing::StatusIs;
using spec::DType;

// A fake source: byte i of the arena is (i * 7 + 3) mod 256.
absl::Status PatternReader(uint64_t offset, uint64_t length, void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  for (uint64_t i = 0; i < length; ++i) {
    out[i] = static_cast<unsigned char>(((offset + i) * 7 + 3) & 0xff);
  }
  return absl::OkStatus();
}

FileTensor T(const char* name, DType dtype, std::vector<int64_t> shape,
             uint64_t source_offset) {
  FileTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  uint64_t numel = 1;
  for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
  t.nbytes = numel * spec::ItemSize(dtype);
  t.source_offset = source_offset;
  return t;
}

SafetensorsFile Example() {
  return SafetensorsFile::Build(
      {T("b.small", DType::kBFloat16, {3}, 0),
       T("a.weight", DType::kFloat32, {2, 3}, 256),
       T("c.ids", DType::kInt64, {2}, 512),
       T("d.empty", DType::kFloat32, {0}, 768),
       T("a.bias", DType::kFloat32, {3}, 1024)},
      {{"format", "pt"}});
}

TEST(SafetensorsFileTest, HeaderIsExactJsonAlignedToEightBytes) {
  SafetensorsFile file = Example();
  const std::string& header = file.header();
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(header[i]);
  EXPECT_EQ(n + 8, header.size());
  EXPECT_EQ(header.size() % 8, 0u);
  const std::string json = header.substr(8);
  // Largest element size first, then by name; offsets contiguous.
  EXPECT_EQ(json.substr(0, json.find_last_not_of(' ') + 1),
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"c.ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
            "\"a.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[16,28]},"
            "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[28,52]},"
            "\"d.empty\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[52,52]},"
            "\"b.small\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[52,58]}}");
  EXPECT_EQ(file.size(), header.size() + 58);
}

TEST(SafetensorsFileTest, AnyRangeEqualsTheSameSliceOfTheWholeFile) {
  SafetensorsFile file = Example();
  std::string whole;
  ASSERT_OK(file.Read(0, file.size(), PatternReader, &whole));
  ASSERT_EQ(whole.size(), file.size());
  // Tensor a.weight's bytes come from source offset 256.
  const size_t at = file.header().size() + 28;
  unsigned char expected[24];
  ASSERT_OK(PatternReader(256, 24, expected));
  EXPECT_EQ(std::memcmp(whole.data() + at, expected, 24), 0);

  for (uint64_t offset = 0; offset <= file.size(); ++offset) {
    for (uint64_t length : {uint64_t{0}, uint64_t{1}, uint64_t{5},
                            uint64_t{13}, file.size() - offset}) {
      if (length > file.size() - offset) continue;
      std::string part;
      ASSERT_OK(file.Read(offset, length, PatternReader, &part));
      ASSERT_EQ(part, whole.substr(offset, length))
          << "offset " << offset << " length " << length;
    }
  }
}

TEST(SafetensorsFileTest, RangePastTheEndIsOutOfRange) {
  SafetensorsFile file = Example();
  std::string out;
  EXPECT_THAT(file.Read(file.size(), 1, PatternReader, &out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
  EXPECT_THAT(file.Read(file.size() + 1, 0, PatternReader, &out),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(SafetensorsFileTest, EmptyFileIsAValidHeaderOnly) {
  SafetensorsFile file = SafetensorsFile::Build({});
  EXPECT_EQ(file.header().substr(8, 2), "{}");
  EXPECT_EQ(file.size(), 16u);
}

TEST(JsonQuoteTest, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
}

}  // namespace
}  // namespace materializer::delivery
