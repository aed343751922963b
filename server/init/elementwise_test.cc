#include "server/init/elementwise.h"

#include <cmath>
#include <string>

#include "google/protobuf/text_format.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::HasSubstr;
using spec::DType;

v1::Elementwise Map(const std::string& text) {
  v1::Elementwise map;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &map)) << text;
  return map;
}

absl::StatusOr<Interval> Bounds(const std::string& text, Interval leaf,
                                DType tensor = DType::kFloat32) {
  absl::StatusOr<ParsedElementwise> program = ParseElementwise(Map(text), tensor);
  if (!program.ok()) return program.status();
  return CheckElementwiseBounds(*program, leaf, tensor);
}

TEST(ParseElementwise, RefusesMalformedPrograms) {
  EXPECT_THAT(ParseElementwise(Map(""), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("map.ops is empty")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: EXP x: 1 }"), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("map.ops[0].x is 1")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: ADD x: 0 }"), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a second operand")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: EXP x: 0 c: 1 }"), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("takes one operand")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: POW x: 0 y: 0 }"), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("constant exponent")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: CLAMP x: 0 min: 2 max: 1 }"), DType::kFloat32)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is above max")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: MUL x: 0 c: 2 constant_first: true }"),
                               DType::kFloat32)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SUB and DIV")));
  EXPECT_THAT(ParseElementwise(Map("dtype: \"int32\" ops { kind: NEG x: 0 }"), DType::kFloat32)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("map.dtype is int32")));
  EXPECT_THAT(ParseElementwise(Map("ops { kind: NEG x: 0 }"), DType::kInt64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("map.dtype is unset and the tensor is int64")));
  std::string many;
  for (int k = 0; k <= kMaxElementwiseOps; ++k) many += "ops { kind: NEG x: 0 } ";
  EXPECT_THAT(ParseElementwise(Map(many), DType::kFloat32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the limit is 64")));
}

TEST(ElementwiseBounds, FollowsEachOpAndRefusesPoles) {
  // Mamba's dt bias over uniform(0, 1): dt = exp(u ln(1000) + ln(0.001))
  // lies in [0.001, 0.1] (the clamp at 1e-4 never acts), so its inverse
  // softplus lies in about [-6.907, -2.25].
  const std::string dt =
      "dtype: \"float32\" ops { kind: MUL x: 0 c: 4.605170185988091 } "
      "ops { kind: ADD x: 1 c: -6.907755278982137 } ops { kind: EXP x: 2 } "
      "ops { kind: CLAMP x: 3 min: 0.0001 } ops { kind: NEG x: 4 } "
      "ops { kind: EXPM1 x: 5 } ops { kind: NEG x: 6 } ops { kind: LOG x: 7 } "
      "ops { kind: ADD x: 4 y: 8 }";
  absl::StatusOr<Interval> b = Bounds(dt, {0.0, 1.0}, DType::kBFloat16);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_LT(b->lo, -6.90);
  EXPECT_GT(b->lo, -6.92);
  EXPECT_GT(b->hi, -2.3);
  EXPECT_LT(b->hi, 0.0);
  // log(uniform(1, 16)) >= 0 exactly: 1 is a float32 value, not widened.
  b = Bounds("ops { kind: LOG x: 0 } ops { kind: SQRT x: 1 }", {1.0, 16.0});
  EXPECT_THAT(b.status(), IsOk());
  EXPECT_THAT(Bounds("ops { kind: LOG x: 0 }", {0.0, 1.0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("map.ops[0] (log) takes log of values in [0, 1]")));
  EXPECT_THAT(Bounds("ops { kind: RECIPROCAL x: 0 }", {-1.0, 1.0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 0")));
  EXPECT_THAT(Bounds("ops { kind: DIV x: 0 c: 2 constant_first: true }", {-1.0, 1.0})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 0")));
  EXPECT_THAT(Bounds("ops { kind: LOG1P x: 0 }", {-1.0, 1.0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("<= -1")));
  EXPECT_THAT(Bounds("ops { kind: POW x: 0 c: -2 }", {0.0, 1.0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 gives inf")));
  EXPECT_THAT(Bounds("ops { kind: POW x: 0 c: 3 }", {-2.0, 1.0}).status(), IsOk());
  // exp(89) overflows float32 (88.7); exp(88) does not.
  EXPECT_THAT(Bounds("ops { kind: EXP x: 0 }", {0.0, 89.0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float32")));
  EXPECT_THAT(Bounds("ops { kind: EXP x: 0 }", {0.0, 88.0}).status(), IsOk());
  // Computed in float32, stored in float16: the result must fit float16.
  EXPECT_THAT(Bounds("dtype: \"float32\" ops { kind: EXP x: 0 }", {0.0, 12.0},
                     DType::kFloat16)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float16")));
  // x - x is not known to be 0: bounds do not track correlation.
  b = Bounds("ops { kind: SUB x: 0 y: 0 }", {1.0, 2.0});
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_LE(b->lo, -1.0);
}

TEST(LeafBounds, CoversEveryValueASchemeWrites) {
  spec::TensorDesc t;
  t.name = "w";
  t.shape = {64, 32};
  t.numel = 64 * 32;
  v1::InitScheme normal;
  normal.mutable_normal()->set_mean(1.0);
  normal.mutable_normal()->set_std(0.5);
  absl::StatusOr<Interval> b = LeafBounds(normal, t);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_DOUBLE_EQ(b->lo, 1.0 - 4.5);
  EXPECT_DOUBLE_EQ(b->hi, 1.0 + 4.5);
  v1::InitScheme kaiming;
  kaiming.mutable_kaiming_uniform()->set_a(std::sqrt(5.0));
  b = LeafBounds(kaiming, t);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_NEAR(b->hi, 1.0 / std::sqrt(32.0), 1e-12);  // torch's Linear bound
  v1::InitScheme empty;
  empty.mutable_empty();
  EXPECT_THAT(LeafBounds(empty, t).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot start")));
}

}  // namespace
}  // namespace materializer::init
