#include "server/init/init_math.h"

#include <cmath>

#include "google/protobuf/text_format.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(FanInAndFanOutTest, MatchesTorchFor2DAndConvShapes) {
  // Linear: (out_features, in_features).
  ASSERT_OK_AND_ASSIGN(Fans linear, FanInAndFanOut({768, 3072}));
  EXPECT_EQ(linear.fan_in, 3072);
  EXPECT_EQ(linear.fan_out, 768);
  // Conv2d: (out, in / groups, kh, kw): both times the receptive field.
  ASSERT_OK_AND_ASSIGN(Fans conv, FanInAndFanOut({64, 3, 7, 5}));
  EXPECT_EQ(conv.fan_in, 3 * 35);
  EXPECT_EQ(conv.fan_out, 64 * 35);
  ASSERT_OK_AND_ASSIGN(Fans conv3d, FanInAndFanOut({4, 2, 3, 3, 3}));
  EXPECT_EQ(conv3d.fan_in, 54);
  EXPECT_EQ(conv3d.fan_out, 108);
  ASSERT_OK_AND_ASSIGN(Fans zero, FanInAndFanOut({0, 5}));
  EXPECT_EQ(zero.fan_in, 5);
  EXPECT_EQ(zero.fan_out, 0);
  EXPECT_THAT(FanInAndFanOut({5}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("at least 2 dimensions; it has 1")));
  EXPECT_THAT(FanInAndFanOut({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("it has 0")));
}

TEST(CalculateGainTest, TableOfTorchValues) {
  for (const char* linear :
       {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "sigmoid"}) {
    EXPECT_EQ(CalculateGain(linear, std::nullopt).value(), 1.0) << linear;
  }
  EXPECT_EQ(CalculateGain("tanh", std::nullopt).value(), 5.0 / 3);
  EXPECT_EQ(CalculateGain("relu", std::nullopt).value(), std::sqrt(2.0));
  EXPECT_EQ(CalculateGain("selu", std::nullopt).value(), 0.75);
  // leaky_relu: sqrt(2 / (1 + slope ** 2)), slope 0.01 by default.
  EXPECT_EQ(CalculateGain("leaky_relu", std::nullopt).value(),
            std::sqrt(2.0 / (1 + LibmPow(0.01, 2))));
  EXPECT_EQ(CalculateGain("leaky_relu", 0.0).value(), std::sqrt(2.0));
  // Linear's kaiming_uniform_(a=math.sqrt(5)): Python gives
  // math.sqrt(5) ** 2 == 5.000000000000001.
  EXPECT_EQ(LibmPow(std::sqrt(5.0), 2), 5.000000000000001);
  EXPECT_EQ(CalculateGain("leaky_relu", std::sqrt(5.0)).value(),
            std::sqrt(2.0 / 6.000000000000001));
  EXPECT_THAT(CalculateGain("gelu", std::nullopt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown nonlinearity \"gelu\""),
                             HasSubstr("leaky_relu, selu"))));
  // Names are case-sensitive, as in torch.
  EXPECT_FALSE(CalculateGain("ReLU", std::nullopt).ok());
}

v1::Gain ParseGain(const std::string& text) {
  v1::Gain gain;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &gain));
  return gain;
}

TEST(ResolveGainTest, ValueNameOrOne) {
  EXPECT_EQ(ResolveGain(ParseGain(""), "g").value(), 1.0);
  EXPECT_EQ(ResolveGain(ParseGain("value: 0.5"), "g").value(), 0.5);
  EXPECT_EQ(ResolveGain(ParseGain("nonlinearity: \"relu\""), "g").value(),
            std::sqrt(2.0));
  EXPECT_EQ(
      ResolveGain(ParseGain("nonlinearity: \"leaky_relu\" param: 0.2"), "g")
          .value(),
      std::sqrt(2.0 / (1 + LibmPow(0.2, 2))));
  EXPECT_THAT(ResolveGain(ParseGain("nonlinearity: \"swish\""), "x.gain"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("x.gain.nonlinearity"),
                             HasSubstr("\"swish\""))));
  EXPECT_THAT(ResolveGain(ParseGain("value: inf"), "x.gain"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("x.gain.value is inf")));
  EXPECT_THAT(
      ResolveGain(ParseGain("value: 1 param: 2"), "x.gain"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x.gain.param")));
  EXPECT_THAT(
      ResolveGain(ParseGain("nonlinearity: \"leaky_relu\" param: nan"), "g"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("g.param")));
}

TEST(FanModeTest, CaseInsensitiveLikeTorch) {
  EXPECT_EQ(ParseFanMode("").value(), FanMode::kFanIn);
  EXPECT_EQ(ParseFanMode("fan_in").value(), FanMode::kFanIn);
  EXPECT_EQ(ParseFanMode("FAN_OUT").value(), FanMode::kFanOut);
  EXPECT_THAT(
      ParseFanMode("fan_avg"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("\"fan_avg\""), HasSubstr("fan_in, fan_out"))));
}

TEST(StdTest, SameArithmeticAsPython) {
  // xavier: gain * math.sqrt(2.0 / float(fan_in + fan_out)).
  EXPECT_EQ(XavierStd({3, 5}, 2.0), 2.0 * std::sqrt(2.0 / 8.0));
  // kaiming: gain / math.sqrt(fan); the bound: math.sqrt(3.0) * std.
  EXPECT_EQ(KaimingStd(7, 1.5), 1.5 / std::sqrt(7.0));
  EXPECT_EQ(UniformBoundForStd(0.25), std::sqrt(3.0) * 0.25);
}

TEST(TruncNormalRangeTest, NormCdfOfTheBounds) {
  // Standard bounds [-2, 2]: l = Phi(-2), u = Phi(2); range [2l-1, 2u-1].
  const TruncNormalRange r = TruncNormalUniformRange(0, 1, -2, 2);
  const double l = (1.0 + std::erf(-2 / std::sqrt(2.0))) / 2.0;
  const double u = (1.0 + std::erf(2 / std::sqrt(2.0))) / 2.0;
  EXPECT_EQ(r.low, 2 * l - 1);
  EXPECT_EQ(r.high, 2 * u - 1);
  EXPECT_NEAR(r.low, -0.9545, 1e-4);
  EXPECT_NEAR(r.high, 0.9545, 1e-4);
  const TruncNormalRange shifted = TruncNormalUniformRange(1, 0.5, 0, 3);
  EXPECT_LT(shifted.low, 0);
  EXPECT_GT(shifted.high, 0.99);
}

}  // namespace
}  // namespace materializer::init
