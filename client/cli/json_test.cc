#include "client/cli/json.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client::cli {
namespace {

using ::testing::HasSubstr;

TEST(JsonObjectTest, SixtyFourBitIntegersAreStringsAsInTheProtoMapping) {
  constexpr uint64_t kBig = std::numeric_limits<uint64_t>::max();
  JsonObject object;
  object.U64("totalBytes", kBig).U32("tensors", 7).Bool("verified", true);
  EXPECT_EQ(object.Render(),
            "{\"totalBytes\":\"18446744073709551615\",\"tensors\":7,"
            "\"verified\":true}");
  // The same rule as the library's printer of the API's messages.
  v1::ReleaseResponse release;
  release.set_freed_bytes(kBig);
  EXPECT_THAT(MessageJson(release),
              HasSubstr("\"freedBytes\":\"18446744073709551615\""));
  v1::MaterializeResponse made;
  made.set_num_tensors(7);
  EXPECT_THAT(MessageJson(made), HasSubstr("\"numTensors\":7"));
  // Defaults are printed too, so scripts find every field.
  EXPECT_THAT(MessageJson(made), HasSubstr("\"arenaBytes\":\"0\""));
}

TEST(JsonObjectTest, StringsAreEscapedAndObjectsNest) {
  JsonObject inner;
  inner.Str("code", "NOT_FOUND");
  JsonObject object;
  object.Str("path", "a \"b\"\n").Object("error", inner);
  object.Strings("findings", {"one", "two"});
  object.Array("none", {});
  EXPECT_EQ(object.Render(),
            "{\"path\":\"a \\\"b\\\"\\n\",\"error\":{\"code\":\"NOT_FOUND\"},"
            "\"findings\":[\"one\",\"two\"],\"none\":[]}");
}

TEST(PrettyJsonTest, IndentsOneMemberPerLine) {
  EXPECT_EQ(PrettyJson("{\"a\":\"x,{y}:\",\"b\":[1,2],\"c\":{},\"d\":[]}"),
            "{\n"
            "  \"a\": \"x,{y}:\",\n"
            "  \"b\": [\n"
            "    1,\n"
            "    2\n"
            "  ],\n"
            "  \"c\": {},\n"
            "  \"d\": []\n"
            "}\n");
  EXPECT_EQ(PrettyJson("{\"q\":\"\\\"}\"}"), "{\n  \"q\": \"\\\"}\"\n}\n");
}

}  // namespace
}  // namespace materializer::client::cli
