#include "server/spec/layout.h"

#include "server/spec/meta_check.h"
#include "tests/testing/status_matchers.h"

namespace materializer::spec {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TensorDesc Desc(const char* name, std::vector<int64_t> shape, DType dtype) {
  TensorDesc t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= static_cast<uint64_t>(s);
  t.nbytes = t.numel * ItemSize(dtype);
  return t;
}

TEST(ComputeLayoutTest, AlignsEveryTensorAndPadsTheEnd) {
  std::vector<TensorDesc> tensors = {
      Desc("a", {3}, DType::kFloat32),       // 12 B
      Desc("b", {0, 7}, DType::kFloat64),    // 0 B
      Desc("c", {64}, DType::kBFloat16),     // 128 B
      Desc("d", {256}, DType::kUInt8),       // 256 B, exactly one block
      Desc("e", {}, DType::kInt64),          // 8 B scalar
  };
  ASSERT_OK_AND_ASSIGN(Layout layout, ComputeLayout(tensors));
  EXPECT_THAT(layout.offsets, ElementsAre(0, 256, 256, 512, 768));
  EXPECT_EQ(layout.arena_bytes, 1024u);
  EXPECT_EQ(layout.tensor_bytes, 12u + 0u + 128u + 256u + 8u);
  EXPECT_EQ(layout.num_elements, 3u + 0u + 64u + 256u + 1u);
  for (uint64_t offset : layout.offsets) {
    EXPECT_EQ(offset % kArenaAlignment, 0u);
  }
}

TEST(ComputeLayoutTest, TiedTensorsShareTheRootsBytes) {
  std::vector<TensorDesc> tensors = {
      Desc("lm_head.weight", {10, 4}, DType::kFloat32),  // tied, listed first
      Desc("wte.weight", {10, 4}, DType::kFloat32),
      Desc("b", {3}, DType::kFloat32),
  };
  tensors[0].tie_root = 1;
  ASSERT_OK_AND_ASSIGN(Layout layout, ComputeLayout(tensors));
  EXPECT_THAT(layout.offsets, ElementsAre(0, 0, 256));
  EXPECT_EQ(layout.tensor_bytes, 160u + 12u);  // counted once
  EXPECT_EQ(layout.num_elements, 40u + 3u);
  EXPECT_EQ(layout.arena_bytes, 512u);
}

TEST(ComputeLayoutTest, EmptyModelHasEmptyArena) {
  ASSERT_OK_AND_ASSIGN(Layout layout, ComputeLayout({}));
  EXPECT_EQ(layout.arena_bytes, 0u);
  EXPECT_TRUE(layout.offsets.empty());
}

TEST(ComputeLayoutTest, TotalOverflowIsInvalidArgument) {
  // Each fits on its own; together they pass 2^63.
  TensorDesc big = Desc("big0", {}, DType::kUInt8);
  big.numel = big.nbytes = (uint64_t{1} << 62) + 1;
  TensorDesc big1 = big;
  big1.name = "big1";
  EXPECT_THAT(ComputeLayout({big, big1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("exceeded at \"big1\"")));
}

TEST(MetaCheckTest, TorchAgreesOnEveryDtype) {
  std::vector<TensorDesc> tensors;
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
        DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
        DType::kUInt8, DType::kBool, DType::kFloat8E4M3FN,
        DType::kFloat8E5M2}) {
    tensors.push_back(Desc(Name(dtype), {3, 5, 7}, dtype));
  }
  tensors.push_back(Desc("zero", {0, 3}, DType::kFloat32));
  tensors.push_back(Desc("scalar", {}, DType::kFloat32));
  EXPECT_THAT(CheckAgainstMetaTensors(tensors), IsOk());
}

TEST(MetaCheckTest, DetectsADisagreement) {
  TensorDesc wrong = Desc("w", {4}, DType::kFloat32);
  wrong.nbytes = 8;  // torch says 16
  EXPECT_THAT(CheckAgainstMetaTensors({wrong}),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("disagrees with the planner")));
}

}  // namespace
}  // namespace materializer::spec
