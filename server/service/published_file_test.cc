#include "server/service/published_file.h"

#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::service {
namespace {

using ::materializer::testing::IsOk;
using ::testing::StartsWith;

std::string ReadPath(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

time_t MtimeOf(const std::string& path) {
  struct stat st = {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_mtime;
}

TEST(PublishedFileTest, ThePathReadsTheLatestContents) {
  absl::StatusOr<std::unique_ptr<PublishedFile>> file =
      PublishedFile::Create("test", "first");
  ASSERT_THAT(file, IsOk());
  EXPECT_THAT((*file)->path(), StartsWith("/proc/self/fd/"));
  EXPECT_EQ(ReadPath((*file)->path()), "first");
  const time_t first = MtimeOf((*file)->path());
  ASSERT_THAT((*file)->Replace("second, longer"), IsOk());
  EXPECT_EQ(ReadPath((*file)->path()), "second, longer");
  ASSERT_THAT((*file)->Replace(""), IsOk());
  EXPECT_EQ(ReadPath((*file)->path()), "");
  // Each version's time is a second past the previous one's, however fast
  // they come.
  EXPECT_GE(MtimeOf((*file)->path()), first + 2);
}

TEST(PublishedFileTest, ReadersSeeWholeVersionsOnly) {
  const std::string a(100000, 'a');
  const std::string b(50000, 'b');
  absl::StatusOr<std::unique_ptr<PublishedFile>> file =
      PublishedFile::Create("test", a);
  ASSERT_THAT(file, IsOk());
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const std::string seen = ReadPath((*file)->path());
      if (seen != a && seen != b) torn.fetch_add(1);
    }
  });
  for (int i = 0; i < 200; ++i) {
    ASSERT_THAT((*file)->Replace(i % 2 == 0 ? b : a), IsOk());
  }
  stop.store(true);
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace materializer::service
