#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_BOX_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_BOX_H_

// Boxes: the sub-tensor a shard asks for, as an offset and a length per
// dimension of the full tensor. A portable fill of a box writes exactly the
// bytes of the same slice of the full tensor, because every element's value
// is a function of its linear index in the full tensor.
//
// Example: rank 1 of 4 holding a Shard(0) of an (11, 8) weight:
//
//   ASSIGN_OR_RETURN(Box box, ShardBox({11, 8}, {{/*dim=*/0, /*index=*/1,
//                                                 /*count=*/4}}));
//   // box.offset == {3, 0}, box.length == {3, 8}: rows 3..5, as
//   // torch.chunk(full, 4, dim=0)[1].

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/init/portable/kernel_params.h"

namespace materializer::init::portable {

struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;
};

// The box that covers the whole tensor.
Box FullBox(absl::Span<const int64_t> shape);

// OK if the box has the tensor's rank and 0 <= offset, 0 <= length,
// offset + length <= size in every dimension; INVALID_ARGUMENT naming the
// dimension otherwise.
absl::Status ValidateBox(absl::Span<const int64_t> shape, const Box& box);

// Product of the lengths (1 for a rank-0 box).
int64_t NumElements(const Box& box);

// The part two boxes of the same rank share, in the same coordinates;
// lengths are 0 where they do not meet (offsets are then meaningless).
Box Intersect(const Box& a, const Box& b);

// `box` in the coordinates of a box that starts at `origin`: offsets
// minus origin (both of the same rank).
Box Relative(const Box& box, absl::Span<const int64_t> origin);

// Split `count` ways along `dim`, take piece `index`: the convenience form
// of a box. The split is torch.chunk's (and so DTensor's Shard(dim)'s):
// every piece has ceil(size / count) elements along dim, the last one
// what is left, and pieces past the end are empty (length 0). For
// size 10, count 4: lengths 3, 3, 3, 1. For size 5, count 4: 2, 2, 1, 0.
// (torch.tensor_split would give 3, 3, 2, 2 and 2, 1, 1, 1.)
struct ShardSpec {
  int dim = 0;
  int64_t index = 0;
  int64_t count = 1;
};

// The box for one or more splits along distinct dimensions (e.g. a 2-D
// block: {{0, r, R}, {1, c, C}}); dimensions not named are whole.
// INVALID_ARGUMENT for a dim out of range or named twice, count < 1, or
// index outside [0, count).
absl::StatusOr<Box> ShardBox(absl::Span<const int64_t> shape,
                             absl::Span<const ShardSpec> shards);

// The box as runs of elements that are contiguous in the full tensor
// (kernel_params.h). Requires a valid box. INVALID_ARGUMENT if, after
// merging the dimensions the box spans whole, more than kMaxRank outer
// dimensions are left.
absl::StatusOr<RunLayout> MakeRunLayout(absl::Span<const int64_t> shape,
                                        const Box& box);

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_BOX_H_
