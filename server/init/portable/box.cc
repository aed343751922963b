#include "server/init/portable/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace materializer::init::portable {

Box FullBox(absl::Span<const int64_t> shape) {
  Box box;
  box.offset.assign(shape.size(), 0);
  box.length.assign(shape.begin(), shape.end());
  return box;
}

absl::Status ValidateBox(absl::Span<const int64_t> shape, const Box& box) {
  if (box.offset.size() != shape.size() || box.length.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "box has ", box.offset.size(), " offsets and ", box.length.size(),
        " lengths for a tensor of rank ", shape.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t offset = box.offset[d];
    const int64_t length = box.length[d];
    if (offset < 0 || length < 0 || offset > shape[d] ||
        length > shape[d] - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("box dimension ", d, ": offset ", offset, " length ",
                       length, " is outside [0, ", shape[d], ")"));
    }
  }
  return absl::OkStatus();
}

int64_t NumElements(const Box& box) {
  int64_t n = 1;
  for (int64_t length : box.length) n *= length;
  return n;
}

Box Intersect(const Box& a, const Box& b) {
  Box out;
  const size_t rank = a.offset.size();
  out.offset.resize(rank);
  out.length.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t begin = std::max(a.offset[d], b.offset[d]);
    const int64_t end =
        std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    out.offset[d] = begin;
    out.length[d] = std::max<int64_t>(0, end - begin);
  }
  return out;
}

Box Relative(const Box& box, absl::Span<const int64_t> origin) {
  Box out = box;
  for (size_t d = 0; d < out.offset.size(); ++d) out.offset[d] -= origin[d];
  return out;
}

absl::StatusOr<Box> ShardBox(absl::Span<const int64_t> shape,
                             absl::Span<const ShardSpec> shards) {
  Box box = FullBox(shape);
  std::vector<bool> seen(shape.size(), false);
  for (const ShardSpec& shard : shards) {
    if (shard.dim < 0 || static_cast<size_t>(shard.dim) >= shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard dim ", shard.dim, " is outside [0, ", shape.size(), ")"));
    }
    if (seen[shard.dim]) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard dim ", shard.dim, " is split twice"));
    }
    seen[shard.dim] = true;
    if (shard.count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard count is ", shard.count, "; it must be >= 1"));
    }
    if (shard.index < 0 || shard.index >= shard.count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard index ", shard.index, " is outside [0, ", shard.count, ")"));
    }
    // torch.chunk: pieces of ceil(size / count).
    const int64_t size = shape[shard.dim];
    const int64_t chunk = size / shard.count + (size % shard.count != 0);
    // chunk * index cannot overflow: index < count and chunk <= size.
    const int64_t begin = chunk == 0 ? 0 : std::min(size, chunk * shard.index);
    const int64_t end = std::min(size, begin + chunk);
    box.offset[shard.dim] = begin;
    box.length[shard.dim] = end - begin;
  }
  return box;
}

absl::StatusOr<RunLayout> MakeRunLayout(absl::Span<const int64_t> shape,
                                        const Box& box) {
  RunLayout layout;
  const int rank = static_cast<int>(shape.size());
  layout.num_runs = 1;
  layout.run_len = 1;
  if (rank == 0) return layout;
  for (int d = 0; d < rank; ++d) {
    if (box.length[d] == 0) {
      layout.num_runs = 0;
      layout.run_len = 0;
      return layout;
    }
  }
  // Full-tensor strides (row-major).
  std::vector<int64_t> stride(rank);
  stride[rank - 1] = 1;
  for (int d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];

  // Merge inner dimensions into the run while the box spans them whole.
  int inner = rank - 1;
  layout.run_len = box.length[inner];
  while (inner > 0 && box.offset[inner] == 0 &&
         box.length[inner] == shape[inner]) {
    --inner;
    layout.run_len *= box.length[inner];
  }
  for (int d = 0; d < rank; ++d) layout.base += box.offset[d] * stride[d];
  // The dimensions above the run; those of length 1 only move the base.
  for (int d = 0; d < inner; ++d) {
    if (box.length[d] == 1) continue;
    if (layout.outer_rank == kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "box has more than ", kMaxRank,
          " partially covered dimensions; merge dimensions first"));
    }
    layout.outer_len[layout.outer_rank] = box.length[d];
    layout.outer_stride[layout.outer_rank] = stride[d];
    ++layout.outer_rank;
    layout.num_runs *= box.length[d];
  }
  return layout;
}

}  // namespace materializer::init::portable
