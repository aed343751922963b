#include "server/init/value_range.h"

#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using spec::DType;
using ::testing::HasSubstr;

v1::InitScheme Parse(const std::string& text) {
  v1::InitScheme scheme;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &scheme))
      << text;
  return scheme;
}

spec::TensorDesc Tensor(std::vector<int64_t> shape, DType dtype) {
  spec::TensorDesc t;
  t.name = "t";
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= s;
  t.nbytes = t.numel * spec::ItemSize(dtype);
  return t;
}

struct Case {
  const char* scheme;
  spec::TensorDesc tensor;
  const char* reason;  // nullptr: accepted
};

void Expect(const Case& c) {
  const absl::Status status = CheckSchemeFits(Parse(c.scheme), c.tensor);
  if (c.reason == nullptr) {
    EXPECT_THAT(status, IsOk()) << c.scheme << " on " << Name(c.tensor.dtype);
  } else {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr(c.reason)))
        << c.scheme << " on " << Name(c.tensor.dtype);
  }
}

// Each rule of docs/init.md ("Ranges") at its edge: the largest accepted
// parameter and the next one up.
TEST(CheckValueRangeTest, EachRuleAtItsEdge) {
  const Case cases[] = {
      // constant and uniform: the values themselves.
      {"constant { val: 65504 }", Tensor({4}, DType::kFloat16), nullptr},
      {"constant { val: 65505 }", Tensor({4}, DType::kFloat16),
       "constant.val is 65505, which overflows float16"},
      {"constant { val: 127 }", Tensor({4}, DType::kInt8), nullptr},
      {"constant { val: 128 }", Tensor({4}, DType::kInt8),
       "int8 cannot represent"},
      {"constant { val: 9223372036854775808 }", Tensor({4}, DType::kInt64),
       "overflows int64"},
      {"uniform { a: -224 b: 224 }", Tensor({4}, DType::kFloat8E4M3FN),
       nullptr},
      {"uniform { a: -225 b: 224 }", Tensor({4}, DType::kFloat8E4M3FN),
       "uniform.b - uniform.a is 449, beyond float8_e4m3fn's largest finite "
       "value 448"},
      {"uniform { a: 0 b: 500 }", Tensor({4}, DType::kFloat8E4M3FN),
       "uniform.b is 500, which overflows float8_e4m3fn"},
      // normal: |mean| + 9 std.
      {"normal { mean: 4 std: 4 }", Tensor({4}, DType::kFloat16), nullptr},
      {"normal { mean: 65504 std: 0 }", Tensor({4}, DType::kFloat16), nullptr},
      {"normal { mean: 0 std: 7278.2 }", Tensor({4}, DType::kFloat16), nullptr},
      {"normal { mean: 0 std: 7278.3 }", Tensor({4}, DType::kFloat16),
       "normal.mean and normal.std: |mean| + 9 std"},
      {"normal { std: 2e307 }", Tensor({4}, DType::kFloat64),
       "beyond float64's largest finite value"},
      {"normal { std: 1e306 }", Tensor({4}, DType::kFloat64), nullptr},
      {"normal { std: 49 mean: 7 }", Tensor({4}, DType::kFloat8E4M3FN),
       nullptr},
      {"normal { std: 49 mean: 7.5 }", Tensor({4}, DType::kFloat8E4M3FN),
       "is 448.5, beyond float8_e4m3fn"},
      // trunc_normal: bounds, mean and std * sqrt(2) in the dtype.
      {"trunc_normal { std: 46000 a: -2 b: 2 }", Tensor({4}, DType::kFloat16),
       nullptr},
      {"trunc_normal { std: 47000 a: -2 b: 2 }", Tensor({4}, DType::kFloat16),
       "trunc_normal.std: std * sqrt(2)"},
      {"trunc_normal { a: -70000 b: 2 }", Tensor({4}, DType::kFloat16),
       "trunc_normal.a is -70000, which overflows float16"},
      {"trunc_normal { mean: 1e39 a: -2 b: 2 }", Tensor({4}, DType::kFloat32),
       "trunc_normal.mean is 1e+39"},
      {"trunc_normal { mean: 1e39 std: 1e300 a: -1e300 b: 1e300 }",
       Tensor({4}, DType::kFloat64), nullptr},
      // Fan-based: the range width (uniform) or 9 std (normal), from the
      // target's shape. [4, 8]: xavier std = gain * sqrt(2 / 12).
      {"xavier_uniform { gain { value: 700 } }",
       Tensor({4, 8}, DType::kFloat8E5M2), nullptr},
      {"xavier_uniform { gain { value: 1000 } }",
       Tensor({4, 8}, DType::kFloat8E4M3FN),
       "xavier_uniform.gain: xavier_uniform(gain=1000) on shape [4, 8] draws "
       "from [-bound, bound], whose width"},
      {"xavier_normal { gain { value: 1e38 } }",
       Tensor({4, 8}, DType::kFloat32),
       "xavier_normal.gain: xavier_normal(gain=1e+38) on shape [4, 8] has a "
       "std of"},
      {"xavier_normal { gain { value: 1e38 } }",
       Tensor({4, 8}, DType::kFloat64), nullptr},
      {"kaiming_uniform { a: 1e308 }", Tensor({4, 8}, DType::kFloat8E4M3FN),
       nullptr},
      {"kaiming_normal { nonlinearity: \"selu\" }",
       Tensor({1, 1}, DType::kFloat8E4M3FN), nullptr},
      // orthogonal: 2 |gain|.
      {"orthogonal { gain { value: -32752 } }", Tensor({4, 4}, DType::kFloat16),
       nullptr},
      {"orthogonal { gain { value: 32753 } }", Tensor({4, 4}, DType::kFloat16),
       "orthogonal.gain: 2 |gain|"},
      // sparse: 9 std.
      {"sparse { sparsity: 0.5 std: 1e38 }", Tensor({4, 4}, DType::kFloat32),
       "sparse.std: 9 std"},
      // arange: the first and the last value.
      {"arange { start: 0.5 }", Tensor({4}, DType::kInt32),
       "arange.start is 0.5; int32 needs an integer"},
      {"arange { start: 100 step: 10 }", Tensor({4}, DType::kInt8),
       "leaves int8's range [-128, 127]"},
      {"arange { step: 1 }", Tensor({65505}, DType::kFloat16), nullptr},
      {"arange { step: 1 }", Tensor({70000}, DType::kFloat16),
       "reaches 69999 over 70000 elements, which overflows float16"},
      {"arange { step: 1e307 }", Tensor({32}, DType::kFloat64),
       "reaches inf over 32 elements"},
      // rope_inv_freq: its largest frequency, with a factor-2 margin, in
      // float32 (its compute type) and the dtype.
      {"rope_inv_freq { base: 0.001 }", Tensor({4}, DType::kFloat16), nullptr},
      // [4]: dim 8, the largest is base^(-6/8).
      {"rope_inv_freq { base: 0.001 }", Tensor({4}, DType::kFloat8E4M3FN),
       nullptr},
      {"rope_inv_freq { base: 0.0001 }", Tensor({4}, DType::kFloat8E4M3FN),
       "rope_inv_freq.base: the largest inverse frequency is 1000"},
      {"rope_inv_freq { base: 1e-40 }", Tensor({4}, DType::kFloat64), nullptr},
      {"rope_inv_freq { base: 1e-60 }", Tensor({4}, DType::kFloat64),
       "beyond half of float32's largest finite value"},
      {"rope_inv_freq { scaling { type: \"linear\" factor: 1e-4 } }",
       Tensor({4}, DType::kFloat16), nullptr},
      {"rope_inv_freq { scaling { type: \"linear\" factor: 1e-5 } }",
       Tensor({4}, DType::kFloat16),
       "rope_inv_freq.base and rope_inv_freq.scaling.factor"},
      {"rope_inv_freq { scaling { type: \"dynamic\" factor: 1e-30 } }",
       Tensor({4}, DType::kFloat16), nullptr},  // no rescaling at init
      {"rope_inv_freq { scaling { type: \"yarn\" factor: 4 beta_fast: 1e-320 "
       "original_max_position_embeddings: 8 } }",
       Tensor({4}, DType::kFloat32),
       "rope_inv_freq.scaling (yarn).beta_fast is 1e-320 with base 10000: "
       "the correction dimension (find_correction_dim) is inf"},
      // Deterministic 0/1 schemes fit every dtype.
      {"eye {}", Tensor({4, 4}, DType::kFloat8E4M3FN), nullptr},
      {"dirac {}", Tensor({2, 2, 3}, DType::kBool), nullptr},
  };
  for (const Case& c : cases) Expect(c);
}

// Nothing is drawn for a tensor without elements, so no range applies
// (torch returns early too); an empty *shard* of a tensor with elements is
// checked like the whole tensor.
TEST(CheckValueRangeTest, ZeroElementTensorsAndEmptyShards) {
  Expect({"xavier_uniform { gain { value: 1e308 } }",
          Tensor({0, 0}, DType::kFloat32), nullptr});
  Expect({"normal { std: 1e308 }", Tensor({0, 4}, DType::kFloat32),
          "normal.mean and normal.std"});
  spec::TensorDesc shard = Tensor({0, 8}, DType::kFloat32);
  shard.shard_full_shape = {4, 8};
  shard.shard_offset = {4, 0};
  Expect(
      {"xavier_uniform { gain { value: 1e308 } }", shard, "on shape [4, 8]"});
  Expect({"arange { step: 1e37 }", shard, nullptr});  // 3.1e38 at the end
  Expect({"arange { step: 2e37 }", shard,
          "over 32 elements, which overflows float32"});
}

}  // namespace
}  // namespace materializer::init
