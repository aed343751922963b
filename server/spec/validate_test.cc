#include "server/spec/validate.h"

#include <string>

#include "google/protobuf/text_format.h"
#include "tests/testing/status_matchers.h"

namespace materializer::spec {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::ModelSpec Parse(const std::string& text) {
  v1::ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model))
      << text;
  return model;
}

absl::Status ValidateText(const std::string& text) {
  return ValidateTensors(Parse(text)).status();
}

TEST(ValidateTensorsTest, AcceptsTypicalModelAndComputesSizes) {
  auto tensors = ValidateTensors(Parse(R"pb(
    tensors { name: "wte.weight" shape: [ 50257, 768 ] dtype: "float32" }
    tensors { name: "ln.bias" shape: [ 768 ] dtype: "torch.bfloat16" }
    tensors {
      name: "rope.inv_freq"
      shape: [ 64 ]
      dtype: "float"
      kind: TENSOR_KIND_BUFFER
      persistent: false
    }
    tensors { name: "scale" dtype: "float64" }
    tensors { name: "empty" shape: [ 0, 5 ] dtype: "int64" }
  )pb"));
  ASSERT_THAT(tensors, IsOk());
  ASSERT_EQ(tensors->size(), 5u);
  EXPECT_EQ((*tensors)[0].numel, 50257u * 768u);
  EXPECT_EQ((*tensors)[0].nbytes, 50257u * 768u * 4u);
  EXPECT_EQ((*tensors)[1].dtype, DType::kBFloat16);
  EXPECT_EQ((*tensors)[1].nbytes, 768u * 2u);
  EXPECT_TRUE((*tensors)[2].is_buffer);
  EXPECT_FALSE((*tensors)[2].persistent);
  EXPECT_EQ((*tensors)[2].dtype, DType::kFloat32);
  EXPECT_EQ((*tensors)[3].numel, 1u);  // 0-d scalar
  EXPECT_EQ((*tensors)[3].nbytes, 8u);
  EXPECT_EQ((*tensors)[4].numel, 0u);  // zero-size is valid
  EXPECT_EQ((*tensors)[4].nbytes, 0u);
}

TEST(ValidateTensorsTest, NegativeDimensionNamesTensorAndDimension) {
  EXPECT_THAT(ValidateText(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" }
                tensors { name: "h.0.w" shape: [ 3, -4 ] dtype: "float32" }
              )pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[1] (\"h.0.w\")"),
                             HasSubstr("shape[1] is -4"))));
}

TEST(ValidateTensorsTest, TooManyDimensions) {
  std::string text = "tensors { name: \"deep\" dtype: \"float32\" shape: [";
  for (int i = 0; i < kMaxRank + 1; ++i) text += (i ? ", 1" : "1");
  text += "] }";
  EXPECT_THAT(ValidateText(text),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"deep\""),
                             HasSubstr("17 dimensions; the limit is 16"))));
}

TEST(ValidateTensorsTest, ElementCountOverflow) {
  EXPECT_THAT(
      ValidateText(R"pb(tensors {
                          name: "huge"
                          shape: [ 4294967296, 4294967296 ]
                          dtype: "int8"
                        })pb"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("\"huge\""), HasSubstr("2^63-1 elements"))));
}

TEST(ValidateTensorsTest, ByteSizeOverflowEvenWhenElementsFit) {
  // 2^62 elements fit in 63 bits; 2^62 * 4 bytes do not.
  EXPECT_THAT(
      ValidateText(R"pb(tensors {
                          name: "big"
                          shape: [ 4611686018427387904 ]
                          dtype: "float32"
                        })pb"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("\"big\""), HasSubstr("2^63-1 bytes"))));
}

TEST(ValidateTensorsTest, DuplicateNamesPointToTheFirst) {
  EXPECT_THAT(ValidateText(R"pb(
                tensors { name: "w" shape: [ 1 ] dtype: "float32" }
                tensors { name: "x" shape: [ 1 ] dtype: "float32" }
                tensors { name: "w" shape: [ 2 ] dtype: "float32" }
              )pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[2] (\"w\")"),
                             HasSubstr("duplicate name"),
                             HasSubstr("model.tensors[0]"))));
}

TEST(ValidateTensorsTest, MalformedNames) {
  const struct {
    const char* name;
    const char* reason;
  } cases[] = {
      {"", "name is empty"},
      {"has space", "0x20"},
      {".leading", "empty dot-separated component"},
      {"trailing.", "empty dot-separated component"},
      {"a..b", "empty dot-separated component"},
      {"tab\there", "0x09"},
      {"quote\"d", "0x22"},
      {"__metadata__", "reserved"},
  };
  for (const auto& c : cases) {
    v1::ModelSpec model;
    v1::TensorSpec* t = model.add_tensors();
    t->set_name(c.name);
    t->set_dtype("float32");
    EXPECT_THAT(ValidateTensors(model).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("model.tensors[0]"),
                               HasSubstr(c.reason))))
        << c.name;
  }
  v1::ModelSpec model;
  v1::TensorSpec* t = model.add_tensors();
  t->set_name(std::string(kMaxNameLength + 1, 'n'));
  t->set_dtype("float32");
  EXPECT_THAT(ValidateTensors(model).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("513 bytes; the limit is 512")));
}

TEST(ValidateTensorsTest, UnknownOrMissingDtypeListsTheKnownOnes) {
  EXPECT_THAT(ValidateText(R"pb(tensors {
                                  name: "w"
                                  shape: [ 1 ]
                                  dtype: "flaot32"
                                })pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown dtype \"flaot32\""),
                             HasSubstr("bfloat16"))));
  EXPECT_THAT(ValidateText(R"pb(tensors { name: "w" shape: [ 1 ] })pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dtype is missing")));
}

TEST(ValidateTensorsTest, NonPersistentParameterIsRejected) {
  EXPECT_THAT(ValidateText(R"pb(tensors {
                                  name: "w"
                                  shape: [ 1 ]
                                  dtype: "float32"
                                  persistent: false
                                })pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("only meaningful for buffers")));
}

// A handle holds at least one tensor: a model without tensors is refused
// (Plan and Materialize alike) rather than materialized as an empty handle.
TEST(ValidateTensorsTest, EmptyModelIsRefused) {
  EXPECT_THAT(ValidateText(""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.tensors: the model has no tensors")));
}

// torch computes stride[d] as the product of the later sizes, each at least
// 1: a shape without elements can still have strides past int64, which the
// meta tensor would refuse with an internal error.
TEST(ValidateTensorsTest, StridesMustFitEvenWithoutElements) {
  EXPECT_THAT(ValidateText(R"pb(tensors {
                                  name: "w"
                                  shape: [ 0, 4294967296, 4294967296 ]
                                  dtype: "float32"
                                })pb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[0] (\"w\")"),
                             HasSubstr("strides of more than 2^63-1"))));
  // The largest strides that fit.
  EXPECT_THAT(ValidateText(R"pb(tensors {
                                  name: "w"
                                  shape: [ 0, 2147483648, 4294967295 ]
                                  dtype: "float32"
                                })pb"),
              IsOk());
  EXPECT_THAT(ValidateText(R"pb(tensors {
                                  name: "w"
                                  shape: [ 4294967296, 0, 4294967296 ]
                                  dtype: "int8"
                                })pb"),
              IsOk());
}

// The proto documents it: printable ASCII without spaces, quotes or
// backslashes (names appear quoted in messages and in file headers).
TEST(ValidateTensorsTest, NamesWithQuotesOrBackslashesAreRefused) {
  for (const char* name : {"a\"b", "a\\b", "a b"}) {
    v1::ModelSpec model;
    v1::TensorSpec* t = model.add_tensors();
    t->set_name(name);
    t->set_dtype("float32");
    EXPECT_THAT(ValidateTensors(model),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("printable ASCII without spaces, quotes or "
                                   "backslashes")))
        << name;
  }
}

}  // namespace
}  // namespace materializer::spec

namespace materializer::spec {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<std::vector<TensorDesc>> ValidateTies(const std::string& text) {
  v1::ModelSpec model;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &model));
  return ValidateTensors(model);
}

TEST(ValidateTiesTest, ChainsResolveToTheirRoot) {
  auto tensors = ValidateTies(R"pb(
    tensors { name: "lm_head.weight" shape: [ 8, 4 ] dtype: "float32" tie_to: "mid" }
    tensors { name: "mid" shape: [ 8, 4 ] dtype: "float32" tie_to: "wte.weight" }
    tensors { name: "wte.weight" shape: [ 8, 4 ] dtype: "float32" }
  )pb");
  ASSERT_THAT(tensors, IsOk());
  EXPECT_EQ((*tensors)[0].tie_root, 2);
  EXPECT_EQ((*tensors)[1].tie_root, 2);
  EXPECT_EQ((*tensors)[2].tie_root, -1);
}

TEST(ValidateTiesTest, BadTiesNameTheTensorAndTheReason) {
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" tie_to: "nope" }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.tensors[0] (\"a\")"),
                             HasSubstr("tie_to \"nope\" names no tensor"))));
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" }
                tensors { name: "b" shape: [ 3 ] dtype: "float32" tie_to: "a" }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"b\""), HasSubstr("[3] float32"),
                             HasSubstr("differs from the root's [2] float32"))));
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" }
                tensors { name: "b" shape: [ 2 ] dtype: "bfloat16" tie_to: "a" }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bfloat16 differs from the root's [2] float32")));
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" tie_to: "b" }
                tensors { name: "b" shape: [ 2 ] dtype: "float32" tie_to: "c" }
                tensors { name: "c" shape: [ 2 ] dtype: "float32" tie_to: "a" }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"a\""), HasSubstr("cycle"))));
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" tie_to: "a" }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cycle")));
  EXPECT_THAT(ValidateTies(R"pb(
                tensors { name: "a" shape: [ 2 ] dtype: "float32" }
                tensors {
                  name: "b"
                  shape: [ 2 ]
                  dtype: "float32"
                  tie_to: "a"
                  init { zeros {} }
                }
              )pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"b\""),
                             HasSubstr("has both tie_to and init"))));
}

}  // namespace
}  // namespace materializer::spec
