#include "server/checkpoint/random_access_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

TEST(RandomAccessFileTest, StringFileReadsRangesAndRefusesPastTheEnd) {
  const StringFile file("hello world");
  EXPECT_EQ(file.size(), 11u);
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadBytes(file, 6, 5));
  EXPECT_EQ(bytes, "world");
  ASSERT_OK_AND_ASSIGN(std::string none, ReadBytes(file, 11, 0));
  EXPECT_EQ(none, "");
  EXPECT_THAT(ReadBytes(file, 7, 5),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("passes the end of a 11-byte file")));
  EXPECT_THAT(ReadBytes(file, ~uint64_t{0}, 2),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(RandomAccessFileTest, FdFileSeesAFileThatShrankAsChanged) {
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR")) + "/shrinking";
  {
    std::ofstream out(path, std::ios::binary);
    out << "0123456789";
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const FdFile file(fd, 10, "models/shrinking");
  ASSERT_OK_AND_ASSIGN(std::string bytes, ReadBytes(file, 2, 8));
  EXPECT_EQ(bytes, "23456789");
  ASSERT_EQ(truncate(path.c_str(), 4), 0);
  EXPECT_THAT(ReadBytes(file, 2, 8),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("models/shrinking changed on disk while "
                                 "being read")));
  char buffer[3];
  EXPECT_THAT(file.ReadAt(8, 3, buffer),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("models/shrinking: read of bytes [8, +3) "
                                 "passes the end of a 10-byte file")));
  close(fd);
}

}  // namespace
}  // namespace materializer::checkpoint
