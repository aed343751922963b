#include "fuzz/readers/zip_reader.h"

#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::fuzz {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

void Put(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

// A stored zip with the given entries, written from the specification
// (APPNOTE 4.3.7, 4.3.12, 4.3.16), with one CRC optionally wrong.
std::string Zip(const std::vector<std::pair<std::string, std::string>>& files,
                bool bad_crc = false) {
  std::string out;
  std::string central;
  for (const auto& [name, data] : files) {
    const uint32_t crc = ZipCrc32(data) ^ (bad_crc ? 1 : 0);
    const uint64_t offset = out.size();
    Put(&out, 0x04034b50, 4);
    Put(&out, 20, 2);
    Put(&out, 0, 2);
    Put(&out, 0, 2);
    Put(&out, 0, 4);
    Put(&out, crc, 4);
    Put(&out, data.size(), 4);
    Put(&out, data.size(), 4);
    Put(&out, name.size(), 2);
    Put(&out, 0, 2);
    out += name + data;
    Put(&central, 0x02014b50, 4);
    Put(&central, 20, 2);
    Put(&central, 20, 2);
    Put(&central, 0, 2);
    Put(&central, 0, 2);
    Put(&central, 0, 4);
    Put(&central, crc, 4);
    Put(&central, data.size(), 4);
    Put(&central, data.size(), 4);
    Put(&central, name.size(), 2);
    Put(&central, 0, 2);
    Put(&central, 0, 2);
    Put(&central, 0, 2);
    Put(&central, 0, 2);
    Put(&central, 0, 4);
    Put(&central, offset, 4);
    central += name;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  Put(&out, 0x06054b50, 4);
  Put(&out, 0, 4);
  Put(&out, files.size(), 2);
  Put(&out, files.size(), 2);
  Put(&out, central.size(), 4);
  Put(&out, cd_offset, 4);
  Put(&out, 0, 2);
  return out;
}

TEST(ZipReaderTest, Crc32MatchesTheCheckValue) {
  EXPECT_EQ(ZipCrc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(ZipCrc32(""), 0u);
}

TEST(ZipReaderTest, ReadsStoredEntries) {
  const std::string zip = Zip({{"archive/a", "hello"}, {"archive/b", ""}});
  ASSERT_OK_AND_ASSIGN(std::vector<ZipEntryView> entries, ReadZip(zip));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].name, "archive/a");
  EXPECT_EQ(zip.substr(entries[0].data_offset, entries[0].size), "hello");
  EXPECT_EQ(entries[1].size, 0u);
}

TEST(ZipReaderTest, RefusesBadCrcTruncationAndDuplicates) {
  EXPECT_THAT(ReadZip(Zip({{"a", "data"}}, /*bad_crc=*/true)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CRC mismatch")));
  const std::string zip = Zip({{"a", "data"}});
  EXPECT_THAT(ReadZip(zip.substr(0, zip.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("end")));
  EXPECT_THAT(ReadZip(Zip({{"a", "x"}, {"a", "y"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two entries named")));
}

}  // namespace
}  // namespace materializer::fuzz
