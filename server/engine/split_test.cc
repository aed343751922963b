#include "server/engine/split.h"

#include "tests/testing/status_matchers.h"

namespace materializer::engine {
namespace {

using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;

spec::TensorDesc T(const char* name, uint64_t nbytes, int tie_root = -1) {
  spec::TensorDesc t;
  t.name = name;
  t.shape = {static_cast<int64_t>(nbytes)};
  t.dtype = spec::DType::kUInt8;
  t.numel = t.nbytes = nbytes;
  t.tie_root = tie_root;
  return t;
}

TEST(GroupForSplitTest, ModulesAndNoSplitPrefixesInOrder) {
  const std::vector<spec::TensorDesc> tensors = {
      T("embed.weight", 1000),
      T("layers.0.attn.q.weight", 100), T("layers.0.attn.k.weight", 100),
      T("layers.0.mlp.weight", 300),
      T("layers.1.attn.q.weight", 100),
      T("head.weight", 0, /*tie_root=*/0),
      T("scale", 8),
  };
  ASSERT_OK_AND_ASSIGN(const SplitUnits units,
                       GroupForSplit(tensors, {"layers.0"}));
  EXPECT_THAT(units.names, ElementsAre("embed", "layers.0", "layers.1.attn.q",
                                       "(root module)"));
  // Each tensor padded to 256 bytes; the tie adds nothing and follows its
  // root.
  EXPECT_THAT(units.bytes, ElementsAre(1024, 256 + 256 + 512, 256, 256));
  EXPECT_THAT(units.unit_of_tensor, ElementsAre(0, 1, 1, 1, 2, 0, 3));
}

TEST(GroupForSplitTest, LongestPrefixWinsAndLimitsHold) {
  const std::vector<spec::TensorDesc> tensors = {
      T("a.b.c.w", 1), T("a.b.x", 1), T("a.bc.w", 1), T("a", 1)};
  ASSERT_OK_AND_ASSIGN(const SplitUnits units,
                       GroupForSplit(tensors, {"a", "a.b", "a.b.c"}));
  // "a.bc" is not under "a.b" (a prefix must end at a dot).
  EXPECT_THAT(units.names, ElementsAre("a.b.c", "a.b", "a"));
  EXPECT_THAT(units.unit_of_tensor, ElementsAre(0, 1, 2, 2));

  // Many prefixes and long dotted names: one pass per name.
  std::vector<std::string> many;
  for (int i = 0; i < 60000; ++i) many.push_back("m." + std::to_string(i));
  std::string deep = "m";
  for (int i = 0; i < 200; ++i) deep += ".x";
  std::vector<spec::TensorDesc> big;
  for (int i = 0; i < 2000; ++i) big.push_back(T(deep.c_str(), 1));
  big.push_back(T("m.59999.w", 1));
  ASSERT_OK_AND_ASSIGN(const SplitUnits grouped, GroupForSplit(big, many));
  EXPECT_EQ(grouped.names.back(), "m.59999");

  many.resize(kMaxNoSplit + 1);
  EXPECT_THAT(GroupForSplit(tensors, many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("the limit is 65536")));
  EXPECT_THAT(GroupForSplit(tensors, {std::string(513, 'a')}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("513 bytes; the limit is 512")));
}

TEST(LayoutPartsTest, PartsAreContiguousAndTiesStayWithTheirRoot) {
  const std::vector<spec::TensorDesc> tensors = {
      T("a.w", 100), T("b.w", 300), T("c.w", 0, /*tie_root=*/0), T("d.w", 10)};
  ASSERT_OK_AND_ASSIGN(PartLayouts parts,
                       LayoutParts(tensors, {0, 1, 0, 1}, 2));
  EXPECT_THAT(parts.bases, ElementsAre(0, 256));
  EXPECT_THAT(parts.global.offsets, ElementsAre(0, 256, 0, 256 + 512));
  EXPECT_EQ(parts.global.arena_bytes, 256u + 512u + 256u);
  EXPECT_EQ(parts.global.tensor_bytes, 410u);
  ASSERT_EQ(parts.tensors[0].size(), 2u);
  EXPECT_EQ(parts.tensors[0][1].tie_root, 0);  // renumbered within the part
  EXPECT_THAT(parts.local_index, ElementsAre(0, 0, 1, 1));
}

}  // namespace
}  // namespace materializer::engine
