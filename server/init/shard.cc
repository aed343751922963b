#include "server/init/shard.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/init/portable/box.h"
#include "server/spec/field_path.h"

namespace materializer::init {
namespace {

absl::Status Invalid(int index, const spec::TensorDesc& tensor,
                     absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat(spec::TensorPath(index, tensor.name), ".shard: ", reason));
}

}  // namespace

absl::Status ApplyShards(const v1::ModelSpec& model, v1::RngMode rng,
                         std::vector<spec::TensorDesc>& tensors) {
  std::vector<bool> tied_to(tensors.size(), false);
  for (const spec::TensorDesc& t : tensors) {
    if (t.tie_root >= 0) tied_to[t.tie_root] = true;
  }
  for (int i = 0; i < model.tensors_size(); ++i) {
    const v1::TensorSpec& spec = model.tensors(i);
    if (!spec.has_shard()) continue;
    spec::TensorDesc& t = tensors[i];
    const v1::Shard& shard = spec.shard();
    if (rng == v1::RNG_MODE_TORCH) {
      return Invalid(
          i, t,
          "shards need RNG_MODE_PORTABLE: torch's generators give a shard "
          "other values than the same slice of the full tensor. Set "
          "model.rng to RNG_MODE_PORTABLE (or leave it unset, the default)");
    }
    if (t.tie_root >= 0 || tied_to[i]) {
      return Invalid(i, t, "a tied tensor cannot be a shard");
    }
    // A 0-d tensor's box has no ranges: an empty Shard is that box (the
    // one element), so code that builds boxes from shapes needs no special
    // case for scalars.
    const bool scalar_box =
        t.shape.empty() && shard.box_size() == 0 && !shard.has_split();
    if (!scalar_box && (shard.box_size() > 0) == shard.has_split()) {
      return Invalid(i, t,
                     "set exactly one of box (a range per dimension) and "
                     "split ({dim, index, count})");
    }
    portable::Box box;
    if (shard.has_split()) {
      const v1::ShardSplit& split = shard.split();
      absl::StatusOr<portable::Box> chunk = portable::ShardBox(
          t.shape, {portable::ShardSpec{split.dim(), split.index(),
                                        split.count()}});
      if (!chunk.ok()) return Invalid(i, t, chunk.status().message());
      box = *std::move(chunk);
    } else {
      if (shard.box_size() != static_cast<int>(t.shape.size())) {
        return Invalid(i, t,
                       absl::StrCat("box has ", shard.box_size(),
                                    " ranges for a tensor of ",
                                    t.shape.size(), " dimensions"));
      }
      for (const v1::DimRange& range : shard.box()) {
        box.offset.push_back(range.offset());
        box.length.push_back(range.length());
      }
      if (absl::Status s = portable::ValidateBox(t.shape, box); !s.ok()) {
        return Invalid(i, t, s.message());
      }
    }
    t.shard_full_shape = t.shape;
    t.shard_offset = box.offset;
    t.shape = box.length;
    t.numel = static_cast<uint64_t>(portable::NumElements(box));
    t.nbytes = t.numel * spec::ItemSize(t.dtype);
  }
  return absl::OkStatus();
}

}  // namespace materializer::init
