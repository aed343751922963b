#include "server/load/checkpoint_load.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/common/kernel_threads.h"
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

namespace {

// A whole tensor is read in pieces of about this many stored bytes, so
// that the readers share a large tensor (an embedding) instead of one of
// them taking it all.
constexpr uint64_t kPieceBytes = uint64_t{16} << 20;

// Elements [begin, end) of tensor `tensor`'s box, in the box's row-major
// order.
struct Piece {
  int tensor = -1;
  int64_t begin = 0;
  int64_t end = 0;
};

// The pieces of every loaded tensor: a tensor whose box is one run of the
// file (a whole tensor, or a Shard(0) block) in kPieceBytes pieces, a box
// of several runs (Shard(1)) and a tensor on a GPU in one piece each.
// Largest first, so the threads finish together.
std::vector<Piece> MakePieces(const LoadPlan& plan,
                              const std::vector<spec::TensorDesc>& tensors,
                              memory::Arena& arena) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int e = plan.entry_of_tensor[i];
    if (e < 0) continue;
    const spec::TensorDesc& t = tensors[i];
    const int64_t numel = static_cast<int64_t>(t.numel);
    if (numel == 0) continue;
    const uint64_t item = spec::ItemSize(plan.checkpoint->entries[e].dtype);
    std::vector<int64_t> offset, length;
    BoxOf(t, &offset, &length);
    int runs = 0;
    (void)ForEachRun(t.full_shape(), offset, length, [&](int64_t, int64_t) {
      return ++runs > 1 ? absl::CancelledError() : absl::OkStatus();
    });
    const bool split = runs == 1 && arena.tensors().views[i].device().is_cpu();
    const int64_t step =
        split ? std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / item))
              : numel;
    for (int64_t b = 0; b < numel; b += step) {
      pieces.push_back({static_cast<int>(i), b, std::min(numel, b + step)});
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.end - a.begin > b.end - b.begin;
  });
  return pieces;
}

// Reads one piece into its tensor's arena view. Host views get the bytes
// in place: copied as they are, or cast block by block straight from the
// cache's block (no staging). A GPU view is staged in host memory and
// copied over whole.
absl::Status LoadPiece(const LoadPlan& plan, const Piece& piece,
                       const spec::TensorDesc& t, at::Tensor& view,
                       RangeCache& cache, RangeCache::Counters* counters) {
  const CheckpointEntry& entry = plan.checkpoint->entries[plan.entry_of_tensor[piece.tensor]];
  const FileSource& file = *plan.checkpoint->files[entry.file];
  const uint64_t item = spec::ItemSize(entry.dtype);
  const bool host = view.device().is_cpu();
  const bool cast = entry.dtype != t.dtype;
  at::Tensor target = host ? view.view({-1})
                           : at::empty({static_cast<int64_t>(t.numel)},
                                       at::TensorOptions().dtype(
                                           spec::ToScalarType(entry.dtype)));
  const at::ScalarType stored = spec::ToScalarType(entry.dtype);
  auto* base = static_cast<char*>(target.data_ptr());
  const uint64_t target_item = host ? spec::ItemSize(t.dtype) : item;
  // Element (box order) the next whole element consumed lands on.
  int64_t at_element = 0;
  auto emit = [&](const char* data, int64_t count) {
    if (count == 0) return;
    if (host && cast) {
      target.narrow(0, at_element, count)
          .copy_(at::from_blob(const_cast<char*>(data), {count},
                               at::TensorOptions().dtype(stored)));
    } else {
      std::memcpy(base + static_cast<uint64_t>(at_element) * target_item, data,
                  static_cast<uint64_t>(count) * item);
    }
    at_element += count;
  };
  // A file's tensors need not be aligned to their item size (safetensors
  // does not require it), so a block boundary may split an element: its
  // first bytes wait here for the rest.
  char carry[8];
  uint64_t carried = 0;
  auto consume = [&](const char* data, uint64_t n) -> absl::Status {
    if (carried > 0) {
      const uint64_t take = std::min(item - carried, n);
      std::memcpy(carry + carried, data, take);
      carried += take;
      data += take;
      n -= take;
      if (carried == item) {
        emit(carry, 1);
        carried = 0;
      }
    }
    const int64_t count = static_cast<int64_t>(n / item);
    emit(data, count);
    carried = n - static_cast<uint64_t>(count) * item;
    std::memcpy(carry, data + static_cast<uint64_t>(count) * item, carried);
    return absl::OkStatus();
  };
  std::vector<int64_t> offset, length;
  BoxOf(t, &offset, &length);
  int64_t box_at = 0;  // box elements before the current run
  RETURN_IF_ERROR(ForEachRun(
      t.full_shape(), offset, length,
      [&](int64_t start, int64_t count) -> absl::Status {
        // The part of this run inside the piece.
        const int64_t lo = std::max(box_at, piece.begin);
        const int64_t hi = std::min(box_at + count, piece.end);
        if (lo < hi) {
          at_element = lo;
          RETURN_IF_ERROR(cache.Visit(
              file, entry.offset + static_cast<uint64_t>(start + (lo - box_at)) * item,
              static_cast<uint64_t>(hi - lo) * item, consume, counters));
        }
        box_at += count;
        return absl::OkStatus();
      }));
  if (!host) view.copy_(target.view(view.sizes()));
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadTensors(const LoadPlan& plan,
                         const std::vector<spec::TensorDesc>& tensors,
                         memory::Arena& arena, RangeCache& cache,
                         v1::CheckpointReport* report,
                         const Cancelled& cancelled) {
  const Checkpoint& ckpt = *plan.checkpoint;
  std::vector<Piece> pieces;
  absl::Status status = GuardTorch("planning the checkpoint reads", [&] {
    pieces = MakePieces(plan, tensors, arena);
  });
  RETURN_IF_ERROR(status);

  // Pieces are taken in order by every reader thread (at::get_num_threads:
  // the server's workers). Reads of a page-cached file are copies, and a
  // cast is arithmetic: both scale with cores; a cold file gets several
  // reads in flight. The first error stops every reader.
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;
  RangeCache::Counters counters;
  auto reader = [&] {
    UseOneKernelThreadHere();
    RangeCache::Counters mine;
    for (size_t p = next++; p < pieces.size() && !failed.load(); p = next++) {
      absl::Status s = CheckCancelled(cancelled);
      if (s.ok()) {
        const Piece& piece = pieces[p];
        const absl::Status guarded = GuardTorch("loading the checkpoint", [&] {
          s = LoadPiece(plan, piece, tensors[piece.tensor],
                        arena.tensors().views[piece.tensor], cache, &mine);
        });
        if (s.ok()) s = guarded;
      }
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = s;
        failed = true;
      }
    }
    absl::MutexLock lock(&mu);
    counters.bytes_read_from_files += mine.bytes_read_from_files;
    counters.bytes_from_cache += mine.bytes_from_cache;
  };
  const int threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(),
                           static_cast<int64_t>(pieces.size()))));
  // Fresh threads only: UseOneKernelThreadHere is a per-thread setting,
  // and the calling worker's own thread count sizes the next request's
  // populate and init threads.
  std::vector<std::thread> readers;
  for (int t = 0; t < threads; ++t) readers.emplace_back(reader);
  for (std::thread& r : readers) r.join();

  report->set_bytes_read_from_files(report->bytes_read_from_files() +
                                    counters.bytes_read_from_files);
  report->set_bytes_from_cache(report->bytes_from_cache() +
                               counters.bytes_from_cache);
  RETURN_IF_ERROR(first_error);
  // A file replaced after its blocks were cached is a new file to the
  // cache; one rewritten in place since PlanLoad opened it is refused here.
  for (const std::unique_ptr<FileSource>& file : ckpt.files) {
    RETURN_IF_ERROR(file->Check());
  }
  return absl::OkStatus();
}

}  // namespace materializer::load
