#include "server/init/values.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace materializer::init {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using spec::DType;
using ::testing::HasSubstr;

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

template <typename T>
v1::Values Values(const std::vector<T>& elements) {
  v1::Values values;
  values.mutable_data()->resize(elements.size() * sizeof(T));
  // memcpy from an empty vector's data() (null) is undefined.
  if (!elements.empty()) {
    std::memcpy(values.mutable_data()->data(), elements.data(),
                values.data().size());
  }
  return values;
}

v1::Values Bytes(const std::vector<uint8_t>& bytes) { return Values(bytes); }

TEST(CheckValuesTest, SizeIsElementsTimesItemSize) {
  EXPECT_THAT(
      CheckValues(Values<float>({1, 2, 3, 4}), Tensor({2, 2}, DType::kFloat32)),
      IsOk());
  EXPECT_THAT(
      CheckValues(Values<float>({1, 2, 3}), Tensor({2, 2}, DType::kFloat32)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("values.data has 12 bytes; shape [2, 2] of float32 "
                         "needs 16 (4 elements x 4 bytes")));
  EXPECT_THAT(CheckValues(Bytes({}), Tensor({0, 3}, DType::kFloat16)), IsOk());
  EXPECT_THAT(CheckValues(Bytes({1}), Tensor({}, DType::kUInt8)), IsOk());
  // A shard's values cover the whole tensor.
  spec::TensorDesc shard = Tensor({1, 2}, DType::kInt16);
  shard.shard_full_shape = {3, 2};
  shard.shard_offset = {2, 0};
  EXPECT_THAT(CheckValues(Values<int16_t>({1, 2, 3, 4, 5, 6}), shard), IsOk());
  EXPECT_THAT(CheckValues(Values<int16_t>({5, 6}), shard),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shape [3, 2] of int16 needs 12")));
}

TEST(CheckValuesTest, BoolsAreZeroOrOne) {
  EXPECT_THAT(CheckValues(Bytes({0, 1, 1, 0}), Tensor({4}, DType::kBool)),
              IsOk());
  EXPECT_THAT(CheckValues(Bytes({0, 1, 2, 0}), Tensor({4}, DType::kBool)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element 2 is 2; bool values are one byte "
                                 "each, 0 or 1")));
}

// NaN is refused in every floating dtype, by its bit pattern; infinities
// (attention masks) and every finite value pass, integers are never NaN.
TEST(CheckValuesTest, NaNIsRefusedInfinitiesPass) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THAT(CheckValues(Values<float>({0, -inf, inf, -0.0f}),
                          Tensor({4}, DType::kFloat32)),
              IsOk());
  EXPECT_THAT(CheckValues(Values<float>({0, std::nanf("")}),
                          Tensor({2}, DType::kFloat32)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element 1 is NaN; float32 values may be "
                                 "finite or infinite, not NaN")));
  EXPECT_THAT(CheckValues(Values<double>({std::nan(""), 1}),
                          Tensor({2}, DType::kFloat64)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element 0 is NaN")));
  const struct {
    DType dtype;
    std::vector<uint16_t> ok;  // inf, -inf, largest finite
    uint16_t nan;
  } halves[] = {{DType::kFloat16, {0x7c00, 0xfc00, 0x7bff}, 0x7e01},
                {DType::kBFloat16, {0x7f80, 0xff80, 0x7f7f}, 0xffc0}};
  for (const auto& h : halves) {
    EXPECT_THAT(CheckValues(Values(h.ok), Tensor({3}, h.dtype)), IsOk());
    EXPECT_THAT(CheckValues(Values<uint16_t>({0, h.nan}), Tensor({2}, h.dtype)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("element 1 is NaN")));
  }
  // float8_e4m3fn: 0x7e is 448, 0x7f/0xff NaN (no infinity).
  EXPECT_THAT(
      CheckValues(Bytes({0x7e, 0xfe}), Tensor({2}, DType::kFloat8E4M3FN)),
      IsOk());
  EXPECT_THAT(CheckValues(Bytes({0xff}), Tensor({1}, DType::kFloat8E4M3FN)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN")));
  // float8_e5m2: 0x7c inf, 0x7d..0x7f NaN.
  EXPECT_THAT(
      CheckValues(Bytes({0x7c, 0xfc, 0x7b}), Tensor({3}, DType::kFloat8E5M2)),
      IsOk());
  EXPECT_THAT(CheckValues(Bytes({0x7d}), Tensor({1}, DType::kFloat8E5M2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NaN")));
  EXPECT_THAT(CheckValues(Bytes({0xff, 0xff}), Tensor({1}, DType::kInt16)),
              IsOk());
}

}  // namespace
}  // namespace materializer::init
