#include "server/checkpoint/shard_index.h"

#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/status_matchers.h"

namespace materializer::checkpoint {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr absl::string_view kLabel = "models/m/model.safetensors.index.json";

TEST(ShardIndexTest, ParsesWeightMapAndIgnoresMetadata) {
  ASSERT_OK_AND_ASSIGN(
      ShardIndex index,
      ParseShardIndex(R"({"metadata": {"total_size": 3000, "x": [1.5, null]},
                          "weight_map": {"b": "model-00002-of-00002.safetensors",
                                         "a": "model-00001-of-00002.safetensors",
                                         "c": "model-00001-of-00002.safetensors"}})",
                      kLabel));
  EXPECT_THAT(index.weight_map,
              ElementsAre(Pair("a", "model-00001-of-00002.safetensors"),
                          Pair("b", "model-00002-of-00002.safetensors"),
                          Pair("c", "model-00001-of-00002.safetensors")));
  EXPECT_THAT(index.files, ElementsAre("model-00001-of-00002.safetensors",
                                       "model-00002-of-00002.safetensors"));
}

// Written by transformers' save_pretrained (testdata/generate.py).
TEST(ShardIndexTest, ReadsTheIndexSavePretrainedWrote) {
  std::ifstream in("server/checkpoint/testdata/gpt2.safetensors.index.json");
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  ASSERT_OK_AND_ASSIGN(ShardIndex index,
                       ReadShardIndex(StringFile(json), kLabel));
  EXPECT_EQ(index.weight_map.size(), 28u);  // GPT-2, 2 layers, tied lm_head
  EXPECT_EQ(index.weight_map.at("transformer.wte.weight"),
            "model-00001-of-00009.safetensors");
  ASSERT_EQ(index.files.size(), 9u);
  EXPECT_EQ(index.files.front(), "model-00001-of-00009.safetensors");
  EXPECT_EQ(index.files.back(), "model-00009-of-00009.safetensors");
}

TEST(ShardIndexTest, RefusesFileNamesOutsideItsFolderAndBadJson) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"weight_map": {"w": "../model.safetensors"}})",
       "tensor \"w\": file name \"../model.safetensors\" has a '/'"},
      {R"({"weight_map": {"w": "sub/model.safetensors"}})", "has a '/'"},
      {R"({"weight_map": {"w": ".."}})", "file name \"..\" names a folder"},
      {R"({"weight_map": {"w": "."}})", "names a folder"},
      {R"({"weight_map": {"w": ""}})", "is empty"},
      {R"({"weight_map": {"w": "a\u0000b"}})", "has a NUL byte"},
      {R"({"weight_map": {"w": 7}})",
       "tensor \"w\" maps to something other than a file name string"},
      {R"({"weight_map": {"w": ["a"]}})", "something other than"},
      {R"({"weight_map": ["a"]})", "weight_map is not an object"},
      {R"({"metadata": {}})", "has no weight_map"},
      {R"(["weight_map"])", "is not a JSON object"},
      {R"({"weight_map": {"w": "a", "w": "b"}})", "duplicate key \"w\""},
      {R"({"weight_map": {}, "weight_map": {}})", "duplicate key"},
      {R"({"metadata": {"k": 1, "k": 2}, "weight_map": {}})",
       "duplicate key \"k\""},
      {R"({"weight_map": {"w": "a"}} trailing)", "text after the JSON value"},
  };
  for (const auto& [json, reason] : cases) {
    EXPECT_THAT(ParseShardIndex(json, kLabel),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(kLabel), HasSubstr(reason))))
        << json;
  }
}

TEST(ShardIndexTest, RefusesAnIndexOverTheSizeLimit) {
  class Huge : public RandomAccessFile {
   public:
    uint64_t size() const override { return kMaxShardIndexBytes + 1; }
    absl::Status ReadAt(uint64_t, uint64_t, char*) const override {
      return absl::InternalError("read");
    }
  };
  EXPECT_THAT(ReadShardIndex(Huge(), kLabel),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("larger than the limit of 67108864 bytes")));
}

}  // namespace
}  // namespace materializer::checkpoint
