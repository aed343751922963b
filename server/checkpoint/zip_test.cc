#include "server/checkpoint/zip.h"

#include <string>

#include "server/checkpoint/test_files.h"
#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TestZip;
using testing::TestZipOptions;

constexpr absl::string_view kLabel = "models/a.pt";

// The data of every entry, through the directory and local headers.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Contents(
    const std::string& zip) {
  const StringFile file(zip);
  absl::StatusOr<ZipDirectory> directory = ReadZipDirectory(file, kLabel);
  if (!directory.ok()) return directory.status();
  std::vector<std::pair<std::string, std::string>> out;
  for (const ZipEntry& entry : directory->entries) {
    absl::StatusOr<uint64_t> at =
        ZipEntryDataOffset(file, *directory, entry, kLabel);
    if (!at.ok()) return at.status();
    out.emplace_back(entry.name, zip.substr(*at, entry.size));
  }
  return out;
}

TEST(ZipTest, Crc32MatchesTheCheckValue) {
  EXPECT_EQ(ZipCrc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(ZipCrc32(""), 0u);
  EXPECT_EQ(ZipCrc32("6789", ZipCrc32("12345")), 0xCBF43926u);
}

TEST(ZipTest, ReadsStoredEntriesInEveryLayout) {
  TestZipOptions torch_style;
  torch_style.data_descriptors = true;
  torch_style.zip64_end = true;
  TestZipOptions commented;
  commented.comment = "a comment \x50\x4b\x05\x06 that looks like a record";
  for (const TestZipOptions& options :
       {TestZipOptions{}, torch_style, commented}) {
    const std::string zip =
        TestZip({{"archive/a", "hello"}, {"archive/b", ""}}, options);
    ASSERT_OK_AND_ASSIGN(auto contents, Contents(zip));
    ASSERT_EQ(contents.size(), 2u);
    EXPECT_EQ(contents[0].first, "archive/a");
    EXPECT_EQ(contents[0].second, "hello");
    EXPECT_EQ(contents[1].first, "archive/b");
    EXPECT_EQ(contents[1].second, "");
  }
}

TEST(ZipTest, RefusesBrokenArchivesNamingTheFile) {
  const std::string zip = TestZip({{"a", "data"}});
  const std::pair<std::string, std::string> cases[] = {
      {"", "too short for a zip archive"},
      {std::string(100, 'x'), "no end of central directory record"},
      {zip.substr(0, zip.size() - 1), "no end of central directory record"},
      {zip.substr(1), "does not end where the end records start"},
      {TestZip({{"a", "x"}, {"a", "y"}}), "two entries named \"a\""},
  };
  for (const auto& [bytes, reason] : cases) {
    EXPECT_THAT(Contents(bytes),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(kLabel), HasSubstr(reason))))
        << reason;
  }
}

TEST(ZipTest, RefusesCompressedEntriesAndDisagreeingLocalHeaders) {
  EXPECT_THAT(Contents(TestZip({{"a", "data", /*method=*/8}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("zip entry \"a\": is compressed (method 8)")));
  // The local header names another file.
  std::string renamed = TestZip({{"abc", "data"}});
  renamed[30] = 'x';
  EXPECT_THAT(Contents(renamed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the local header names another file")));
  // The local header's size disagrees (no data descriptor).
  std::string resized = TestZip({{"a", "data"}});
  resized[22] = 5;
  EXPECT_THAT(Contents(resized),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("disagree with the central directory")));
  // Encrypted.
  std::string encrypted = TestZip({{"a", "data"}});
  const size_t central = encrypted.find(std::string("PK\x01\x02", 4));
  encrypted[central + 8] = 1;
  EXPECT_THAT(Contents(encrypted),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is encrypted")));
}

}  // namespace
}  // namespace materializer::checkpoint
