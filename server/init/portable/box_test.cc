#include "server/init/portable/box.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace materializer::init::portable {
namespace {

using ::materializer::testing::IsOk;
using ::materializer::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> ChunkLengths(int64_t size, int64_t count) {
  std::vector<int64_t> lengths;
  int64_t next = 0;
  for (int64_t i = 0; i < count; ++i) {
    absl::StatusOr<Box> box = ShardBox({size}, {{0, i, count}});
    EXPECT_THAT(box, IsOk());
    // Pieces are consecutive (empty ones sit at the end).
    if (box->length[0] > 0) {
      EXPECT_EQ(box->offset[0], next);
    }
    next = box->offset[0] + box->length[0];
    lengths.push_back(box->length[0]);
  }
  EXPECT_EQ(next, size);
  return lengths;
}

TEST(BoxTest, IntersectAndRelative) {
  const Box rows{{2, 0}, {4, 8}};    // rows 2..5 of an (8, 8) tensor
  const Box region{{5, 3}, {3, 2}};  // rows 5..7, columns 3..4
  const Box both = Intersect(rows, region);
  EXPECT_THAT(both.offset, ElementsAre(5, 3));
  EXPECT_THAT(both.length, ElementsAre(1, 2));
  EXPECT_EQ(NumElements(both), 2);
  const Box in_region = Relative(both, region.offset);
  EXPECT_THAT(in_region.offset, ElementsAre(0, 0));
  const Box in_rows = Relative(both, rows.offset);
  EXPECT_THAT(in_rows.offset, ElementsAre(3, 3));
  // Disjoint, and touching at an edge: nothing shared.
  EXPECT_EQ(NumElements(Intersect(Box{{0}, {3}}, Box{{5}, {2}})), 0);
  EXPECT_EQ(NumElements(Intersect(Box{{0}, {3}}, Box{{3}, {2}})), 0);
  // Rank 0: the one element.
  EXPECT_EQ(NumElements(Intersect(Box{}, Box{})), 1);
}

TEST(ShardBoxTest, SplitsLikeTorchChunk) {
  EXPECT_THAT(ChunkLengths(10, 4), ElementsAre(3, 3, 3, 1));
  EXPECT_THAT(ChunkLengths(12, 4), ElementsAre(3, 3, 3, 3));
  EXPECT_THAT(ChunkLengths(5, 4), ElementsAre(2, 2, 1, 0));
  EXPECT_THAT(ChunkLengths(3, 5), ElementsAre(1, 1, 1, 0, 0));
  EXPECT_THAT(ChunkLengths(0, 3), ElementsAre(0, 0, 0));
  EXPECT_THAT(ChunkLengths(7, 1), ElementsAre(7));
}

TEST(ShardBoxTest, TwoDimensionalBlocks) {
  absl::StatusOr<Box> box = ShardBox({11, 8}, {{0, 1, 4}, {1, 1, 2}});
  ASSERT_THAT(box, IsOk());
  EXPECT_THAT(box->offset, ElementsAre(3, 4));
  EXPECT_THAT(box->length, ElementsAre(3, 4));
  EXPECT_EQ(NumElements(*box), 12);
}

TEST(ShardBoxTest, RejectsBadSpecs) {
  EXPECT_THAT(ShardBox({4, 4}, {{2, 0, 2}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shard dim 2 is outside [0, 2)")));
  EXPECT_THAT(
      ShardBox({4, 4}, {{0, 0, 2}, {0, 1, 2}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("split twice")));
  EXPECT_THAT(
      ShardBox({4}, {{0, 0, 0}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("count is 0")));
  EXPECT_THAT(ShardBox({4}, {{0, 2, 2}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("index 2 is outside [0, 2)")));
}

TEST(ValidateBoxTest, ChecksRankAndBounds) {
  EXPECT_THAT(ValidateBox({4, 5}, Box{{0, 1}, {4, 4}}), IsOk());
  EXPECT_THAT(ValidateBox({4, 5}, Box{{0, 0}, {0, 0}}), IsOk());
  EXPECT_THAT(ValidateBox({4, 5}, Box{{0}, {4}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor of rank 2")));
  EXPECT_THAT(ValidateBox({4, 5}, Box{{0, 2}, {4, 4}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("box dimension 1: offset 2 length 4")));
  EXPECT_THAT(ValidateBox({4, 5}, Box{{-1, 0}, {1, 1}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("box dimension 0")));
}

TEST(RunLayoutTest, FullTensorIsOneRun) {
  absl::StatusOr<RunLayout> layout =
      MakeRunLayout({3, 4, 5}, FullBox({3, 4, 5}));
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->num_runs, 1);
  EXPECT_EQ(layout->run_len, 60);
  EXPECT_EQ(layout->base, 0);
  EXPECT_EQ(layout->outer_rank, 0);
}

TEST(RunLayoutTest, RowBlockIsOneRunAtItsOffset) {
  absl::StatusOr<RunLayout> layout =
      MakeRunLayout({10, 6}, Box{{4, 0}, {3, 6}});
  ASSERT_THAT(layout, IsOk());
  EXPECT_EQ(layout->num_runs, 1);
  EXPECT_EQ(layout->run_len, 18);
  EXPECT_EQ(layout->base, 24);
}

TEST(RunLayoutTest, ColumnBlockIsOneRunPerRow) {
  absl::StatusOr<RunLayout> layout =
      MakeRunLayout({2, 10, 6}, Box{{1, 2, 1}, {1, 3, 4}});
  ASSERT_THAT(layout, IsOk());
  // Dimension 0 has length 1: it only moves the base.
  EXPECT_EQ(layout->outer_rank, 1);
  EXPECT_EQ(layout->outer_len[0], 3);
  EXPECT_EQ(layout->outer_stride[0], 6);
  EXPECT_EQ(layout->num_runs, 3);
  EXPECT_EQ(layout->run_len, 4);
  EXPECT_EQ(layout->base, 60 + 12 + 1);
}

TEST(RunLayoutTest, EmptyAndScalarBoxes) {
  absl::StatusOr<RunLayout> empty = MakeRunLayout({4, 4}, Box{{0, 0}, {0, 4}});
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(empty->num_runs * empty->run_len, 0);
  absl::StatusOr<RunLayout> scalar = MakeRunLayout({}, FullBox({}));
  ASSERT_THAT(scalar, IsOk());
  EXPECT_EQ(scalar->num_runs, 1);
  EXPECT_EQ(scalar->run_len, 1);
}

TEST(RunLayoutTest, TooManyPartialDimensions) {
  std::vector<int64_t> shape(10, 3);
  Box box = FullBox(shape);
  for (int d = 0; d < 10; ++d) box.length[d] = 2;
  EXPECT_THAT(MakeRunLayout(shape, box),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("partially covered dimensions")));
}

}  // namespace
}  // namespace materializer::init::portable
