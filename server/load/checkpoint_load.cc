#include "server/load/checkpoint_load.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/memory/arena_views.h"
#include "server/spec/torch_dtype.h"

namespace materializer::load {
namespace {

// Key rules longer than this are refused (a tensor name's own limit is far
// below).
constexpr size_t kMaxKeyRuleBytes = 1024;
// Missing tensors named in a require_all error.
constexpr size_t kMaxListed = 20;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckRules(const v1::CheckpointSource& source) {
  if (source.key_rules_size() > kMaxKeyRules) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.key_rules: ", source.key_rules_size(),
                     " rules; the limit is ", kMaxKeyRules));
  }
  for (int r = 0; r < source.key_rules_size(); ++r) {
    const v1::KeyRule& rule = source.key_rules(r);
    if (rule.from().size() > kMaxKeyRuleBytes ||
        rule.to().size() > kMaxKeyRuleBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.key_rules[", r, "]: longer than ",
                       kMaxKeyRuleBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

// Whether stored dtype `from` may fill a tensor of dtype `to`.
bool Castable(spec::DType from, spec::DType to, v1::CheckpointDtypePolicy policy) {
  if (from == to) return true;
  if (policy != v1::CHECKPOINT_DTYPE_POLICY_CAST) return false;
  return spec::Info(from).is_floating_point && spec::Info(to).is_floating_point;
}

// The box of tensor `t` in its full shape: offset and length per dim.
void BoxOf(const spec::TensorDesc& t, std::vector<int64_t>* offset,
           std::vector<int64_t>* length) {
  const std::vector<int64_t>& full = t.full_shape();
  *length = t.shape;
  if (t.is_shard()) {
    *offset = t.shard_offset;
  } else {
    offset->assign(full.size(), 0);
  }
}

// Calls run(start, count) for each contiguous run of the box in the
// row-major full tensor, in the box's own row-major order (elements).
template <typename Fn>
absl::Status ForEachRun(const std::vector<int64_t>& full,
                        const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& length, Fn&& run) {
  const int rank = static_cast<int>(full.size());
  for (int64_t l : length) {
    if (l == 0) return absl::OkStatus();
  }
  std::vector<int64_t> stride(rank, 1);
  for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * full[d + 1];
  // Dims after k are whole: a run spans them.
  int k = rank - 1;
  while (k >= 0 && offset[k] == 0 && length[k] == full[k]) --k;
  if (k < 0) {
    int64_t n = 1;
    for (int64_t s : full) n *= s;
    return run(0, n);
  }
  const int64_t count = length[k] * stride[k];
  std::vector<int64_t> index(k, 0);
  while (true) {
    int64_t start = offset[k] * stride[k];
    for (int d = 0; d < k; ++d) start += (offset[d] + index[d]) * stride[d];
    RETURN_IF_ERROR(run(start, count));
    int d = k - 1;
    while (d >= 0 && ++index[d] == length[d]) index[d--] = 0;
    if (d < 0) return absl::OkStatus();
  }
}

std::string Describe(const Checkpoint& ckpt, const CheckpointEntry& entry,
                     spec::DType to) {
  std::string text =
      absl::StrCat("checkpoint ", ckpt.files[entry.file]->label(),
                   " at byte ", entry.offset);
  if (entry.key != "") absl::StrAppend(&text, " (key ", entry.key, ")");
  if (entry.dtype != to) {
    absl::StrAppend(&text, ", ", spec::Name(entry.dtype), " cast to ",
                    spec::Name(to));
  }
  return text;
}

}  // namespace

std::string MapKey(const google::protobuf::RepeatedPtrField<v1::KeyRule>& rules,
                   const std::string& name) {
  for (const v1::KeyRule& rule : rules) {
    if (absl::string_view(name).substr(0, rule.from().size()) == rule.from()) {
      return absl::StrCat(rule.to(), name.substr(rule.from().size()));
    }
  }
  return name;
}

absl::StatusOr<LoadPlan> PlanLoad(const v1::CheckpointSource& source,
                                  const std::vector<spec::TensorDesc>& tensors,
                                  const CheckpointOpener& opener,
                                  const std::string& identity) {
  RETURN_IF_ERROR(CheckRules(source));
  if (!v1::CheckpointDtypePolicy_IsValid(source.dtype_policy())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.dtype_policy: unknown policy ", source.dtype_policy()));
  }
  LoadPlan plan;
  ASSIGN_OR_RETURN(plan.checkpoint, opener.Open(source.path(), identity));
  const Checkpoint& ckpt = *plan.checkpoint;
  plan.entry_of_tensor.assign(tensors.size(), -1);
  plan.loaded_descriptions.assign(tensors.size(), "");
  // Which tensor took each entry, to refuse a key mapped twice.
  std::vector<int> taker(ckpt.entries.size(), -1);
  std::vector<int> missing;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const spec::TensorDesc& t = tensors[i];
    if (t.tie_root >= 0) continue;  // its root's bytes
    const std::string key = MapKey(source.key_rules(), t.name);
    auto it = ckpt.entry_of_key.find(key);
    if (it == ckpt.entry_of_key.end()) {
      missing.push_back(static_cast<int>(i));
      continue;
    }
    const CheckpointEntry& entry = ckpt.entries[it->second];
    if (taker[it->second] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.key_rules: tensors ", tensors[taker[it->second]].name,
          " and ", t.name, " both map to checkpoint key ", key, " in ",
          ckpt.path));
    }
    taker[it->second] = static_cast<int>(i);
    if (entry.shape != t.full_shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, ": shape ", ShapeText(t.full_shape()),
          ", but checkpoint key ", key, " in ",
          ckpt.files[entry.file]->label(), " has shape ",
          ShapeText(entry.shape)));
    }
    if (!Castable(entry.dtype, t.dtype, source.dtype_policy())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, ": dtype ", spec::Name(t.dtype),
          ", but checkpoint key ", key, " in ",
          ckpt.files[entry.file]->label(), " is ", spec::Name(entry.dtype),
          source.dtype_policy() == v1::CHECKPOINT_DTYPE_POLICY_CAST
              ? " (only floating dtypes are cast into each other)"
              : " (checkpoint.dtype_policy is EXACT)"));
    }
    plan.entry_of_tensor[i] = it->second;
    plan.loaded_descriptions[i] = Describe(ckpt, entry, t.dtype);
    ++plan.tensors_loaded;
  }
  if (source.require_all() && !missing.empty()) {
    std::vector<std::string> names;
    for (size_t m = 0; m < missing.size() && m < kMaxListed; ++m) {
      names.push_back(absl::StrCat(
          tensors[missing[m]].name, " (key ",
          MapKey(source.key_rules(), tensors[missing[m]].name), ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.require_all: ", missing.size(), " tensor",
        missing.size() == 1 ? " is" : "s are", " not in ", ckpt.path, ": ",
        absl::StrJoin(names, ", "),
        missing.size() > kMaxListed ? ", ..." : ""));
  }
  for (size_t e = 0; e < ckpt.entries.size(); ++e) {
    if (taker[e] < 0) plan.unused_keys.push_back(ckpt.entries[e].key);
  }
  std::sort(plan.unused_keys.begin(), plan.unused_keys.end());
  return plan;
}

absl::Status LoadTensors(const LoadPlan& plan,
                         const std::vector<spec::TensorDesc>& tensors,
                         memory::Arena& arena, RangeCache& cache,
                         v1::CheckpointReport* report,
                         const Cancelled& cancelled) {
  const Checkpoint& ckpt = *plan.checkpoint;
  RangeCache::Counters counters;
  auto load_each = [&]() -> absl::Status {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int e = plan.entry_of_tensor[i];
      if (e < 0) continue;
      RETURN_IF_ERROR(CheckCancelled(cancelled));
      const spec::TensorDesc& t = tensors[i];
      const CheckpointEntry& entry = ckpt.entries[e];
      const FileSource& file = *ckpt.files[entry.file];
      at::Tensor& view = arena.tensors().views[i];
      // Straight into the arena where it is host memory of the stored
      // dtype; else through a staging tensor that copy_ casts and moves.
      const bool direct = view.device().is_cpu() && entry.dtype == t.dtype;
      at::Tensor staging =
          direct ? view
                 : at::empty(t.shape, at::TensorOptions().dtype(
                                          spec::ToScalarType(entry.dtype)));
      auto* dst = static_cast<char*>(staging.data_ptr());
      const uint64_t item = spec::ItemSize(entry.dtype);
      std::vector<int64_t> offset, length;
      BoxOf(t, &offset, &length);
      RETURN_IF_ERROR(ForEachRun(
          t.full_shape(), offset, length,
          [&](int64_t start, int64_t count) -> absl::Status {
            const uint64_t bytes = static_cast<uint64_t>(count) * item;
            RETURN_IF_ERROR(cache.Read(
                file, entry.offset + static_cast<uint64_t>(start) * item,
                bytes, dst, &counters));
            dst += bytes;
            return absl::OkStatus();
          }));
      if (!direct) view.copy_(staging);
    }
    return absl::OkStatus();
  };
  absl::Status status;
  const absl::Status guarded =
      GuardTorch("loading the checkpoint", [&] { status = load_each(); });
  if (status.ok()) status = guarded;
  report->set_bytes_read_from_files(report->bytes_read_from_files() +
                                    counters.bytes_read_from_files);
  report->set_bytes_from_cache(report->bytes_from_cache() +
                               counters.bytes_from_cache);
  RETURN_IF_ERROR(status);
  // A file replaced after its blocks were cached is a new file to the
  // cache; one rewritten in place since PlanLoad opened it is refused here.
  for (const std::unique_ptr<FileSource>& file : ckpt.files) {
    RETURN_IF_ERROR(file->Check());
  }
  return absl::OkStatus();
}

}  // namespace materializer::load
