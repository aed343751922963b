#include "server/init/schemes.h"

#include "google/protobuf/text_format.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::InitScheme Parse(const std::string& text) {
  v1::InitScheme scheme;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &scheme))
      << text;
  return scheme;
}

spec::TensorDesc Tensor(std::vector<int64_t> shape,
                        spec::DType dtype = spec::DType::kFloat32) {
  spec::TensorDesc t;
  t.name = "t";
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= s;
  t.nbytes = t.numel * spec::ItemSize(dtype);
  return t;
}

TEST(CheckSchemeParametersTest, GoodParametersPass) {
  for (const char* text : {
           "zeros {}",
           "trunc_normal {}",
           "trunc_normal { mean: 0 std: 0.02 a: -0.04 b: 0.04 }",
           "xavier_uniform {}",
           "xavier_normal { gain { nonlinearity: \"tanh\" } }",
           "kaiming_uniform { a: 2.23 mode: \"FAN_OUT\" }",
           "kaiming_normal { nonlinearity: \"relu\" }",
           "orthogonal { gain { value: 0.5 } }",
           "eye {}",
           "dirac { groups: 2 }",
           "sparse { sparsity: 0.9 }",
           "sparse { sparsity: 0 std: 0 }",
           "module_default {}",
           "empty {}",
           "arange { start: -3 step: 0.5 }",
           "rope_inv_freq {}",
           "rope_inv_freq { scaling { type: \"linear\" factor: 2 } }",
           "rope_inv_freq { scaling { type: \"dynamic\" factor: 2 } }",
           "rope_inv_freq { base: 500000 scaling { type: \"llama3\" factor: 8 "
           "original_max_position_embeddings: 8192 } }",
           "rope_inv_freq { scaling { type: \"yarn\" factor: 4 "
           "original_max_position_embeddings: 4096 beta_fast: 16 } }",
       }) {
    EXPECT_THAT(CheckSchemeParameters(Parse(text)), IsOk()) << text;
  }
}

TEST(CheckSchemeParametersTest, BadParametersSayWhichAndWhy) {
  const struct {
    const char* scheme;
    const char* reason;
  } cases[] = {
      {"trunc_normal { std: 0 }", "trunc_normal.std is 0; it must be > 0"},
      {"trunc_normal { std: -1 }", "trunc_normal.std is -1"},
      {"trunc_normal { a: 2 b: 2 }", "a must be < b"},
      {"trunc_normal { a: 3 }", "trunc_normal.a is 3 and trunc_normal.b is 2"},
      {"trunc_normal { mean: nan }", "trunc_normal.mean is nan"},
      {"trunc_normal { b: inf }", "trunc_normal.b is inf"},
      {"xavier_uniform { gain { value: nan } }",
       "xavier_uniform.gain.value is nan"},
      {"xavier_normal { gain { nonlinearity: \"gelu\" } }",
       "unknown nonlinearity \"gelu\"; use one of linear, conv1d"},
      {"kaiming_uniform { mode: \"fan_avg\" }",
       "kaiming_uniform.mode: unknown mode \"fan_avg\"; use one of fan_in, "
       "fan_out"},
      {"kaiming_normal { nonlinearity: \"swish\" }",
       "kaiming_normal.nonlinearity: unknown nonlinearity \"swish\""},
      {"kaiming_normal { a: inf }", "kaiming_normal.a is inf"},
      {"orthogonal { gain { value: -inf } }", "orthogonal.gain.value is -inf"},
      {"dirac { groups: 0 }", "dirac.groups is 0; it must be >= 1"},
      {"sparse { sparsity: 1.5 }",
       "sparse.sparsity is 1.5; it must be in [0, 1]"},
      {"sparse { sparsity: -0.1 }", "must be in [0, 1]"},
      {"sparse { sparsity: 0.5 std: -1 }", "sparse.std is -1"},
      {"sparse { sparsity: nan }", "sparse.sparsity is nan"},
      {"arange { step: inf }", "arange.step is inf"},
      {"rope_inv_freq { base: 0 }", "rope_inv_freq.base is 0; it must be > 0"},
      {"rope_inv_freq { dim: 0 }", "rope_inv_freq.dim is 0"},
      {"rope_inv_freq { scaling { type: \"ntk\" } }",
       "\"ntk\"; use one of default, linear, dynamic, llama3, yarn"},
      {"rope_inv_freq { scaling { type: \"linear\" } }",
       "(linear).factor is 0; it must be > 0"},
      {"rope_inv_freq { scaling { type: \"llama3\" factor: 8 } }",
       "original_max_position_embeddings is 0"},
      {"rope_inv_freq { scaling { type: \"llama3\" factor: 8 "
       "low_freq_factor: 4 high_freq_factor: 4 "
       "original_max_position_embeddings: 10 } }",
       "high_freq_factor must be > low_freq_factor"},
      {"rope_inv_freq { scaling { type: \"yarn\" factor: 2 "
       "original_max_position_embeddings: 10 beta_slow: 0 } }",
       "(yarn).beta_slow is 0"},
      {"rope_inv_freq { base: 1 scaling { type: \"yarn\" factor: 2 "
       "original_max_position_embeddings: 10 } }",
       "yarn divides by log(base)"},
      {"xavier_uniform { gain { value: -1 } }",
       "xavier_uniform.gain.value is -1; it must be >= 0"},
      {"xavier_normal { gain { value: -0.5 } }",
       "xavier_normal.gain.value is -0.5; it must be >= 0"},
      {"", "no scheme is set; set one of zeros"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(
        CheckSchemeParameters(Parse(c.scheme)),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.reason)))
        << c.scheme;
  }
}

TEST(CheckSchemeForTensorTest, ShapesAndDtypes) {
  using spec::DType;
  const struct {
    const char* scheme;
    spec::TensorDesc tensor;
    const char* reason;  // nullptr: accepted
  } cases[] = {
      {"xavier_uniform {}", Tensor({5}),
       "needs a tensor with at least 2 dimensions"},
      {"kaiming_normal {}", Tensor({}), "shape []"},
      {"kaiming_uniform {}", Tensor({0, 5}), nullptr},  // torch: a no-op
      {"xavier_uniform {}", Tensor({0, 0}), nullptr},
      {"orthogonal {}", Tensor({7}),
       "orthogonal needs a tensor with at least 2"},
      {"orthogonal {}", Tensor({3, 4, 5}, DType::kBFloat16), nullptr},
      {"eye {}", Tensor({3, 3, 3}), "eye needs a 2-D tensor"},
      {"eye {}", Tensor({3, 5}, DType::kBool), nullptr},
      {"eye {}", Tensor({3, 5}, DType::kInt8), nullptr},
      {"dirac {}", Tensor({3, 3}), "dirac needs a 3-, 4- or 5-D tensor"},
      {"dirac {}", Tensor({2, 2, 2, 2, 2, 2}), "shape [2, 2, 2, 2, 2, 2]"},
      {"dirac { groups: 2 }", Tensor({3, 2, 3}),
       "dirac(groups=2) needs dimension 0 divisible by groups"},
      {"dirac { groups: 3 }", Tensor({6, 2, 3, 3}, DType::kInt32), nullptr},
      {"sparse { sparsity: 0.5 }", Tensor({4, 4, 4}), "sparse needs a 2-D"},
      {"trunc_normal {}", Tensor({4}, DType::kInt64),
       "needs a floating-point dtype; the tensor is int64"},
      {"xavier_normal {}", Tensor({4, 4}, DType::kBool),
       "needs a floating-point dtype"},
      {"trunc_normal {}", Tensor({4}, DType::kFloat8E4M3FN), nullptr},
      {"arange {}", Tensor({4}, DType::kBool), "arange cannot fill a bool"},
      {"arange { start: 100 step: 9 }", Tensor({4}, DType::kInt8), nullptr},
      {"arange { start: 0 step: 1 }", Tensor({0}, DType::kInt8), nullptr},
      {"arange { step: 1 }", Tensor({2048}, DType::kFloat16), nullptr},
      {"rope_inv_freq {}", Tensor({64}), nullptr},
      {"rope_inv_freq {}", Tensor({8, 8}), "needs a 1-D tensor"},
      {"rope_inv_freq { dim: 128 }", Tensor({32}),
       "with dim 128 gives 64 frequencies"},
      {"rope_inv_freq { dim: 7 }", Tensor({4}), nullptr},
      {"rope_inv_freq { dim: 7 scaling { type: \"yarn\" factor: 2 "
       "original_max_position_embeddings: 64 } }",
       Tensor({4}), "yarn needs an even dim"},
      {"rope_inv_freq {}", Tensor({4}, DType::kInt32),
       "needs a floating-point dtype"},
      {"kaiming_uniform {}", Tensor({4, 4}, DType::kFloat8E5M2), nullptr},
  };
  for (const auto& c : cases) {
    const absl::Status status = CheckSchemeForTensor(Parse(c.scheme), c.tensor);
    if (c.reason == nullptr) {
      EXPECT_THAT(status, IsOk()) << c.scheme;
    } else {
      EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr(c.reason)))
          << c.scheme;
    }
  }
}

TEST(DescribeSchemeTest, ReadsLikeTheCall) {
  EXPECT_EQ(DescribeScheme(Parse("trunc_normal { std: 0.02 }")),
            "trunc_normal(mean=0, std=0.02, a=-2, b=2)");
  EXPECT_EQ(DescribeScheme(Parse("xavier_uniform {}")),
            "xavier_uniform(gain=1)");
  EXPECT_EQ(DescribeScheme(Parse(
                "xavier_normal { gain { nonlinearity: \"leaky_relu\" param: "
                "0.2 } }")),
            "xavier_normal(gain=leaky_relu(0.2))");
  EXPECT_EQ(DescribeScheme(Parse("kaiming_normal { mode: \"fan_out\" "
                                 "nonlinearity: \"relu\" }")),
            "kaiming_normal(a=0, mode=fan_out, nonlinearity=relu)");
  EXPECT_EQ(DescribeScheme(Parse("dirac {}")), "dirac(groups=1)");
  EXPECT_EQ(DescribeScheme(Parse("sparse { sparsity: 0.25 }")),
            "sparse(sparsity=0.25, std=0.01)");
  EXPECT_EQ(DescribeScheme(Parse("arange {}")), "arange(start=0, step=1)");
  EXPECT_EQ(DescribeScheme(
                Parse("rope_inv_freq { base: 500000 scaling { type: \"llama3\" "
                      "factor: 8 original_max_position_embeddings: 8192 } }")),
            "rope_inv_freq(base=500000, scaling=llama3(factor=8, "
            "low_freq_factor=1, high_freq_factor=4, "
            "original_max_position_embeddings=8192))");
  EXPECT_EQ(DescribeScheme(Parse("empty {}")), "empty");
  EXPECT_EQ(DescribeScheme(Parse("module_default {}")), "module_default");
}

TEST(IsRandomTest, OnlyDrawingSchemes) {
  for (const char* random :
       {"uniform {}", "normal {}", "trunc_normal {}", "xavier_uniform {}",
        "xavier_normal {}", "kaiming_uniform {}", "kaiming_normal {}",
        "orthogonal {}", "sparse {}"}) {
    EXPECT_TRUE(IsRandom(Parse(random))) << random;
  }
  for (const char* fixed :
       {"zeros {}", "ones {}", "constant {}", "eye {}", "dirac {}", "arange {}",
        "rope_inv_freq {}", "empty {}", "module_default {}"}) {
    EXPECT_FALSE(IsRandom(Parse(fixed))) << fixed;
  }
}

}  // namespace
}  // namespace materializer::init
