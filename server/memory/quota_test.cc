#include "server/memory/quota.h"

#include "tests/testing/status_matchers.h"

namespace materializer::memory {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;

TEST(QuotaBookTest, ClientsStartFromTheDefault) {
  ASSERT_OK_AND_ASSIGN(QuotaBook book, QuotaBook::FromJson(R"({
    "default": {"totalBytes": "64GiB", "deviceBytes": "40GiB", "handles": 100},
    "clients": {
      "trainer-a": {"totalBytes": "200GiB", "devices": {"cuda:0": "80GiB"}},
      "ci": {"totalBytes": 4096, "handles": 10}
    }})"));
  const Quota& a = book.For("trainer-a");
  EXPECT_EQ(a.total_bytes, 200ull << 30);
  EXPECT_EQ(a.BytesOn("cuda:0"), 80ull << 30);
  EXPECT_EQ(a.BytesOn("cuda:1"), 40ull << 30);  // from the default
  EXPECT_EQ(a.handles, 100u);
  EXPECT_EQ(book.For("ci").total_bytes, 4096u);
  EXPECT_EQ(book.For("ci").handles, 10u);
  EXPECT_EQ(book.For("someone-else").total_bytes, 64ull << 30);
}

TEST(QuotaBookTest, NoFileMeansNoLimits) {
  QuotaBook book;
  EXPECT_EQ(book.For("x").total_bytes, kNoByteLimit);
  EXPECT_EQ(book.For("x").BytesOn("cpu"), kNoByteLimit);
  EXPECT_EQ(book.For("x").handles, kNoHandleLimit);
}

TEST(QuotaBookTest, ErrorsNameTheKey) {
  EXPECT_THAT(QuotaBook::FromJson("{nope").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not JSON")));
  EXPECT_THAT(QuotaBook::FromJson(R"({"clients": {"a": {"totalBytes": "lots"}}})")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("clients.a.totalBytes")));
  EXPECT_THAT(QuotaBook::FromJson(R"({"default": {"handles": -1}})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("default.handles")));
  EXPECT_THAT(QuotaBook::FromJson(R"({"default": {"bytes": 1}})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("default.bytes: unknown key")));
  EXPECT_THAT(QuotaBook::FromJson(R"({"quotas": {}})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("quotas: unknown key")));
}

}  // namespace
}  // namespace materializer::memory
