#include "server/load/checkpoint_load.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/common/kernel_threads.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/delivery/digest.h"
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
  uint64_t from_bytes = 0;
  for (int r = 0; r < source.key_rules_size(); ++r) {
    const v1::KeyRule& rule = source.key_rules(r);
    if (rule.from().size() > kMaxKeyRuleBytes ||
        rule.to().size() > kMaxKeyRuleBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.key_rules[", r, "]: longer than ",
                       kMaxKeyRuleBytes, " bytes"));
    }
    from_bytes += rule.from().size();
  }
  // Every tensor's name is compared with the rules' `from`s in turn: their
  // total length bounds that work.
  if (from_bytes > kMaxKeyRuleFromBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.key_rules: ", from_bytes,
        " bytes of `from` prefixes in all; the limit is ",
        kMaxKeyRuleFromBytes));
  }
  return absl::OkStatus();
}

// Whether stored dtype `from` may fill a tensor of dtype `to`.
bool Castable(spec::DType from, spec::DType to, v1::CheckpointDtypePolicy policy) {
  if (from == to) return true;
  if (policy != v1::CHECKPOINT_DTYPE_POLICY_CAST) return false;
  return spec::Info(from).is_floating_point && spec::Info(to).is_floating_point;
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


const char* CastRefusal(v1::CheckpointDtypePolicy policy) {
  return policy == v1::CHECKPOINT_DTYPE_POLICY_CAST
             ? " (only floating dtypes are cast into each other)"
             : " (checkpoint.dtype_policy is EXACT)";
}

absl::Status CheckAssemblyCounts(const v1::CheckpointSource& source) {
  int64_t parts = 0;
  for (int a = 0; a < source.assemblies_size(); ++a) {
    const int n = source.assemblies(a).parts_size();
    if (n > kMaxPartsPerTensor) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.assemblies[", a, "].parts: ", n,
                       " parts; the limit is ", kMaxPartsPerTensor));
    }
    parts += n;
  }
  if (parts > kMaxAssemblyParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint.assemblies: ", parts,
                     " parts in all; the limit is ", kMaxAssemblyParts));
  }
  return absl::OkStatus();
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> WithoutOnes(const std::vector<int64_t>& shape) {
  std::vector<int64_t> out;
  for (int64_t s : shape) {
    if (s != 1) out.push_back(s);
  }
  return out;
}

// Whether a box (offset, length) lies inside `shape`, each length >= 1.
// The values come from a request: no arithmetic that could overflow.
bool BoxInside(const std::vector<int64_t>& offset,
               const std::vector<int64_t>& length,
               const std::vector<int64_t>& shape) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (offset[d] < 0 || length[d] < 1 || offset[d] > shape[d] ||
        length[d] > shape[d] - offset[d]) {
      return false;
    }
  }
  return true;
}

bool BoxesOverlap(const LoadSource& a, const LoadSource& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] + a.shape[d] <= b.offset[d] ||
        b.offset[d] + b.shape[d] <= a.offset[d]) {
      return false;
    }
  }
  return true;
}

// Checks CheckpointSource.assemblies against the request's tensors and the
// checkpoint's entries, and records each assembled tensor's sources.
absl::Status PlanAssemblies(const v1::CheckpointSource& source,
                            const std::vector<spec::TensorDesc>& tensors,
                            const Checkpoint& ckpt, LoadPlan* plan) {
  if (source.assemblies_size() == 0) return absl::OkStatus();
  absl::flat_hash_map<absl::string_view, int> index_of;
  for (size_t i = 0; i < tensors.size(); ++i) {
    index_of.emplace(tensors[i].name, static_cast<int>(i));
  }
  for (int a = 0; a < source.assemblies_size(); ++a) {
    const v1::TensorAssembly& assembly = source.assemblies(a);
    const std::string field = absl::StrCat("checkpoint.assemblies[", a, "]");
    auto found = index_of.find(assembly.tensor());
    if (found == index_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".tensor: the model has no tensor named \"",
          assembly.tensor(), "\""));
    }
    const int i = found->second;
    const spec::TensorDesc& t = tensors[i];
    if (t.tie_root >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".tensor: ", t.name, " is tied to ", tensors[t.tie_root].name,
          " and takes its bytes; assemble the root instead"));
    }
    std::vector<LoadSource>& sources = plan->sources_of_tensor[i];
    if (!sources.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".tensor: ", t.name, " is assembled twice"));
    }
    if (assembly.parts_size() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parts: empty; ", t.name, " needs its boxes"));
    }
    const std::vector<int64_t>& full = t.full_shape();
    int64_t covered = 0;
    for (int p = 0; p < assembly.parts_size(); ++p) {
      const v1::AssemblyPart& part = assembly.parts(p);
      const std::string pfield = absl::StrCat(field, ".parts[", p, "]");
      auto e = ckpt.entry_of_key.find(part.key());
      if (e == ckpt.entry_of_key.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            pfield, ".key: ", part.key(), " is not in ", ckpt.path));
      }
      const CheckpointEntry& entry = ckpt.entries[e->second];
      LoadSource s;
      s.entry = e->second;
      if (part.key_offset_size() == 0 && part.key_shape_size() == 0) {
        s.key_offset.assign(entry.shape.size(), 0);
        s.key_shape = entry.shape;
      } else {
        s.key_offset.assign(part.key_offset().begin(), part.key_offset().end());
        s.key_shape.assign(part.key_shape().begin(), part.key_shape().end());
      }
      if (s.key_offset.size() != entry.shape.size() ||
          s.key_shape.size() != entry.shape.size() ||
          !BoxInside(s.key_offset, s.key_shape, entry.shape)) {
        return absl::InvalidArgumentError(absl::StrCat(
            pfield, ": box at ", ShapeText(s.key_offset), " of shape ",
            ShapeText(s.key_shape), " is not inside checkpoint key ",
            part.key(), " of shape ", ShapeText(entry.shape), " in ",
            ckpt.files[entry.file]->label()));
      }
      s.offset.assign(part.offset().begin(), part.offset().end());
      if (part.shape_size() == 0) {
        if (s.key_shape.size() <= full.size()) {
          s.shape.assign(full.size() - s.key_shape.size(), 1);
          s.shape.insert(s.shape.end(), s.key_shape.begin(), s.key_shape.end());
        }
      } else {
        s.shape.assign(part.shape().begin(), part.shape().end());
      }
      if (s.offset.size() != full.size() || s.shape.size() != full.size() ||
          !BoxInside(s.offset, s.shape, full)) {
        return absl::InvalidArgumentError(absl::StrCat(
            pfield, ": box at ", ShapeText(s.offset), " of shape ",
            ShapeText(s.shape), " is not inside tensor ", t.name,
            " of shape ", ShapeText(full)));
      }
      if (WithoutOnes(s.shape) != WithoutOnes(s.key_shape)) {
        return absl::InvalidArgumentError(absl::StrCat(
            pfield, ": box of shape ", ShapeText(s.shape), " in tensor ",
            t.name, " and box of shape ", ShapeText(s.key_shape),
            " in checkpoint key ", part.key(),
            " differ (beyond dims of size 1)"));
      }
      if (!Castable(entry.dtype, t.dtype, source.dtype_policy())) {
        return absl::InvalidArgumentError(absl::StrCat(
            pfield, ": tensor ", t.name, " is ", spec::Name(t.dtype),
            ", but checkpoint key ", part.key(), " in ",
            ckpt.files[entry.file]->label(), " is ", spec::Name(entry.dtype),
            CastRefusal(source.dtype_policy())));
      }
      for (size_t q = 0; q < sources.size(); ++q) {
        if (BoxesOverlap(s, sources[q])) {
          return absl::InvalidArgumentError(absl::StrCat(
              pfield, ": box at ", ShapeText(s.offset), " of shape ",
              ShapeText(s.shape), " overlaps parts[", q, "] in tensor ",
              t.name));
        }
      }
      covered += Numel(s.shape);
      sources.push_back(std::move(s));
    }
    if (static_cast<uint64_t>(covered) != t.full_numel()) {
      sources.clear();
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".parts: cover ", covered, " of the ", t.full_numel(),
          " elements of tensor ", t.name, " ", ShapeText(full),
          "; the boxes must tile it"));
    }
    const CheckpointEntry& first = ckpt.entries[sources[0].entry];
    plan->loaded_descriptions[i] = absl::StrCat(
        "checkpoint ", ckpt.path, ", assembled from ", sources.size(),
        " boxes (the first: key ", first.key, " in ",
        ckpt.files[first.file]->label(), " at byte ", first.offset, ")",
        first.dtype != t.dtype
            ? absl::StrCat(", ", spec::Name(first.dtype), " cast to ",
                           spec::Name(t.dtype))
            : "");
  }
  return absl::OkStatus();
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
  RETURN_IF_ERROR(CheckAssemblyCounts(source));
  LoadPlan plan;
  ASSIGN_OR_RETURN(plan.checkpoint, opener.Open(source.path(), identity));
  const Checkpoint& ckpt = *plan.checkpoint;
  plan.sources_of_tensor.assign(tensors.size(), {});
  plan.loaded_descriptions.assign(tensors.size(), "");
  // Which tensor took each entry, to refuse a key mapped twice; kAssembled
  // for an entry that assemblies read from.
  constexpr int kAssembled = -2;
  std::vector<int> taker(ckpt.entries.size(), -1);
  RETURN_IF_ERROR(PlanAssemblies(source, tensors, ckpt, &plan));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!plan.sources_of_tensor[i].empty()) {
      ++plan.tensors_loaded;
      ++plan.tensors_assembled;
      for (const LoadSource& s : plan.sources_of_tensor[i]) {
        taker[s.entry] = kAssembled;
      }
    }
  }
  std::vector<int> missing;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const spec::TensorDesc& t = tensors[i];
    if (t.tie_root >= 0) continue;  // its root's bytes
    if (!plan.sources_of_tensor[i].empty()) continue;  // assembled
    const std::string key = MapKey(source.key_rules(), t.name);
    auto it = ckpt.entry_of_key.find(key);
    if (it == ckpt.entry_of_key.end()) {
      missing.push_back(static_cast<int>(i));
      continue;
    }
    const CheckpointEntry& entry = ckpt.entries[it->second];
    if (taker[it->second] == kAssembled) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint.key_rules: tensor ", t.name, " maps to checkpoint key ",
          key, " in ", ckpt.path,
          ", which checkpoint.assemblies also read from"));
    }
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
          CastRefusal(source.dtype_policy())));
    }
    LoadSource whole;
    whole.entry = it->second;
    whole.key_offset.assign(entry.shape.size(), 0);
    whole.key_shape = entry.shape;
    whole.offset.assign(entry.shape.size(), 0);
    whole.shape = entry.shape;
    plan.sources_of_tensor[i].push_back(std::move(whole));
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
    if (taker[e] == -1) plan.unused_keys.push_back(ckpt.entries[e].key);
  }
  std::sort(plan.unused_keys.begin(), plan.unused_keys.end());
  return plan;
}

namespace {

// A whole tensor is read in pieces of about this many stored bytes, so
// that the readers share a large tensor (an embedding) instead of one of
// them taking it all.
constexpr uint64_t kPieceBytes = uint64_t{16} << 20;

// A box: its start and its length per dim.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;
};

// The box of tensor `t` in its full shape (its shard's, for a shard).
Box BoxOf(const spec::TensorDesc& t) {
  Box box;
  box.length = t.shape;
  if (t.is_shard()) {
    box.offset = t.shard_offset;
  } else {
    box.offset.assign(t.full_shape().size(), 0);
  }
  return box;
}

// What one source gives one tensor: the elements of the source's box that
// lie in the tensor's own box (all of them, unless the tensor is a shard),
// as a box of the tensor and the same elements as a box of the entry.
struct Overlap {
  Box in_tensor;
  Box in_entry;
  int64_t numel = 0;
};

// False when the source's box and the tensor's box share nothing.
bool OverlapOf(const LoadSource& s, const Box& tensor_box, Overlap* out) {
  const size_t rank = s.offset.size();
  out->in_tensor.offset.resize(rank);
  out->in_tensor.length.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t lo = std::max(s.offset[d], tensor_box.offset[d]);
    const int64_t hi = std::min(s.offset[d] + s.shape[d],
                                tensor_box.offset[d] + tensor_box.length[d]);
    if (hi <= lo) return false;
    out->in_tensor.offset[d] = lo;
    out->in_tensor.length[d] = hi - lo;
  }
  // The dims of size > 1 pair up in order (PlanAssemblies checked that the
  // two boxes' shapes agree once the size-1 dims are left out); a size-1
  // dim of either box is wholly inside the overlap.
  out->in_entry.offset = s.key_offset;
  out->in_entry.length = s.key_shape;
  size_t td = 0;
  for (size_t kd = 0; kd < s.key_shape.size(); ++kd) {
    if (s.key_shape[kd] == 1) continue;
    while (s.shape[td] == 1) ++td;
    out->in_entry.offset[kd] += out->in_tensor.offset[td] - s.offset[td];
    out->in_entry.length[kd] = out->in_tensor.length[td];
    ++td;
  }
  out->numel = 1;
  for (int64_t l : out->in_tensor.length) out->numel *= l;
  return true;
}

// Where element k (in row-major order) of box `inner` lands in a view that
// holds box `outer` row-major (inner lies inside outer), and how many
// elements from k on lie next to it there.
class BoxPlacement {
 public:
  BoxPlacement(const Box& inner, const Box& outer) : length_(inner.length) {
    const int rank = static_cast<int>(inner.length.size());
    start_.resize(rank);
    stride_.assign(rank, 1);
    for (int d = rank - 2; d >= 0; --d) {
      stride_[d] = stride_[d + 1] * outer.length[d + 1];
    }
    for (int d = 0; d < rank; ++d) start_[d] = inner.offset[d] - outer.offset[d];
    // Dims after k are whole in both: a contiguous run spans them.
    int k = rank - 1;
    while (k >= 0 && start_[k] == 0 && inner.length[k] == outer.length[k]) --k;
    run_ = 1;
    for (int d = std::max(k, 0); d < rank; ++d) run_ *= inner.length[d];
    whole_ = k < 0;
  }

  int64_t Position(int64_t k, int64_t* room) const {
    if (whole_) {
      *room = run_ - k;
      return k;
    }
    *room = run_ - k % run_;
    int64_t position = 0;
    for (int d = static_cast<int>(length_.size()) - 1; d >= 0; --d) {
      position += (start_[d] + k % length_[d]) * stride_[d];
      k /= length_[d];
    }
    return position;
  }

 private:
  std::vector<int64_t> length_;
  std::vector<int64_t> start_;
  std::vector<int64_t> stride_;
  int64_t run_ = 1;
  bool whole_ = false;
};

// Elements [begin, end), in row-major order, of what source `source` gives
// tensor `tensor`.
struct Piece {
  int tensor = -1;
  int source = -1;
  int64_t begin = 0;
  int64_t end = 0;
  // The source reads its entry whole and the file records the entry's
  // CRC-32: this piece's bytes go into the check.
  bool check_crc = false;
};

// The pieces of every loaded tensor: a source whose box is one run of its
// file (a whole tensor, a Shard(0) block, a stacked expert) in kPieceBytes
// pieces, a box of several runs (Shard(1)) and a tensor on a GPU in one
// piece each. Largest first, so the threads finish together.
std::vector<Piece> MakePieces(const LoadPlan& plan,
                              const std::vector<spec::TensorDesc>& tensors,
                              memory::Arena& arena) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<LoadSource>& sources = plan.sources_of_tensor[i];
    if (sources.empty() || tensors[i].numel == 0) continue;
    const spec::TensorDesc& t = tensors[i];
    const Box tensor_box = BoxOf(t);
    const bool host = arena.tensors().views[i].device().is_cpu();
    for (size_t k = 0; k < sources.size(); ++k) {
      const CheckpointEntry& entry = plan.checkpoint->entries[sources[k].entry];
      Overlap overlap;
      if (!OverlapOf(sources[k], tensor_box, &overlap)) continue;
      const uint64_t item = spec::ItemSize(entry.dtype);
      int runs = 0;
      (void)ForEachRun(entry.shape, overlap.in_entry.offset,
                       overlap.in_entry.length, [&](int64_t, int64_t) {
                         return ++runs > 1 ? absl::CancelledError()
                                           : absl::OkStatus();
                       });
      const int64_t numel = overlap.numel;
      const int64_t step =
          runs == 1 && host
              ? std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / item))
              : numel;
      const bool check_crc =
          entry.crc32.has_value() &&
          static_cast<uint64_t>(numel) * item == entry.nbytes;
      for (int64_t b = 0; b < numel; b += step) {
        pieces.push_back({static_cast<int>(i), static_cast<int>(k), b,
                          std::min(numel, b + step), check_crc});
      }
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.end - a.begin > b.end - b.begin;
  });
  return pieces;
}

// Reads one piece into its tensor's arena view. Host views get the bytes
// in place: copied as they are, or cast block by block straight from the
// cache's block (no staging). For a GPU view the piece's box is staged in
// host memory and copied over whole. With `crc`, the CRC-32 of the bytes
// read, in file order, continues from *crc.
absl::Status LoadPiece(const LoadPlan& plan, const Piece& piece,
                       const spec::TensorDesc& t, at::Tensor& view,
                       RangeCache& cache, RangeCache::Counters* counters,
                       uint32_t* crc) {
  const LoadSource& source = plan.sources_of_tensor[piece.tensor][piece.source];
  const CheckpointEntry& entry = plan.checkpoint->entries[source.entry];
  const FileSource& file = *plan.checkpoint->files[entry.file];
  const Box tensor_box = BoxOf(t);
  Overlap overlap;
  if (!OverlapOf(source, tensor_box, &overlap)) return absl::OkStatus();
  const uint64_t item = spec::ItemSize(entry.dtype);
  const bool host = view.device().is_cpu();
  const bool cast = entry.dtype != t.dtype;
  const at::ScalarType stored = spec::ToScalarType(entry.dtype);
  at::Tensor target =
      host ? view.view({-1})
           : at::empty({overlap.numel}, at::TensorOptions().dtype(stored));
  auto* base = static_cast<char*>(target.data_ptr());
  const uint64_t target_item = host ? spec::ItemSize(t.dtype) : item;
  // Host: the overlap's elements land in the view that holds the tensor's
  // box; staged: in order.
  const BoxPlacement placement(
      overlap.in_tensor, host ? tensor_box : overlap.in_tensor);
  // Element (overlap order) the next whole element consumed lands on.
  int64_t at_element = 0;
  auto emit = [&](const char* data, int64_t count) {
    while (count > 0) {
      int64_t room = 0;
      const int64_t position = placement.Position(at_element, &room);
      const int64_t n = std::min(count, room);
      if (host && cast) {
        target.narrow(0, position, n)
            .copy_(at::from_blob(const_cast<char*>(data), {n},
                                 at::TensorOptions().dtype(stored)));
      } else {
        std::memcpy(base + static_cast<uint64_t>(position) * target_item, data,
                    static_cast<uint64_t>(n) * item);
      }
      data += static_cast<uint64_t>(n) * item;
      at_element += n;
      count -= n;
    }
  };
  // A file's tensors need not be aligned to their item size (safetensors
  // does not require it), so a block boundary may split an element: its
  // first bytes wait here for the rest.
  char carry[8];
  uint64_t carried = 0;
  auto consume = [&](const char* data, uint64_t n) -> absl::Status {
    if (crc != nullptr) *crc = delivery::Crc32(data, n, *crc);
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
  int64_t box_at = 0;  // overlap elements before the current run
  RETURN_IF_ERROR(ForEachRun(
      entry.shape, overlap.in_entry.offset, overlap.in_entry.length,
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
  if (!host) {
    at::Tensor dest = view;
    for (size_t d = 0; d < overlap.in_tensor.offset.size(); ++d) {
      dest = dest.narrow(static_cast<int64_t>(d),
                         overlap.in_tensor.offset[d] - tensor_box.offset[d],
                         overlap.in_tensor.length[d]);
    }
    dest.copy_(target.view(overlap.in_tensor.length));
  }
  return absl::OkStatus();
}

// Every entry read whole whose file records its CRC-32 (a torch archive's
// storage): its pieces' CRCs, combined in file order, must give it, or the
// file is damaged (DATA_LOSS naming the file and the tensor).
absl::Status CheckCrcs(const LoadPlan& plan, const std::vector<Piece>& pieces,
                       const std::vector<uint32_t>& crcs) {
  std::vector<size_t> checked;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (pieces[p].check_crc) checked.push_back(p);
  }
  auto key = [&](size_t p) {
    return std::make_tuple(pieces[p].tensor, pieces[p].source, pieces[p].begin);
  };
  std::sort(checked.begin(), checked.end(),
            [&](size_t a, size_t b) { return key(a) < key(b); });
  for (size_t k = 0; k < checked.size();) {
    const Piece& first = pieces[checked[k]];
    const LoadSource& source =
        plan.sources_of_tensor[first.tensor][first.source];
    const CheckpointEntry& entry = plan.checkpoint->entries[source.entry];
    const uint64_t item = spec::ItemSize(entry.dtype);
    uint32_t crc = crcs[checked[k]];
    size_t j = k + 1;
    for (; j < checked.size() && pieces[checked[j]].tensor == first.tensor &&
           pieces[checked[j]].source == first.source;
         ++j) {
      const Piece& piece = pieces[checked[j]];
      crc = delivery::Crc32Combine(
          crc, crcs[checked[j]],
          static_cast<uint64_t>(piece.end - piece.begin) * item);
    }
    if (crc != *entry.crc32) {
      return absl::DataLossError(absl::StrCat(
          plan.checkpoint->files[entry.file]->label(), ": tensor ",
          Quote(entry.key), " fails its CRC-32 check (the archive records ",
          absl::Hex(*entry.crc32, absl::kZeroPad8), ", its ", entry.nbytes,
          " bytes give ", absl::Hex(crc, absl::kZeroPad8),
          "): the file is damaged"));
    }
    k = j;
  }
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
  std::vector<uint32_t> crcs(pieces.size(), 0);
  auto reader = [&] {
    UseOneKernelThreadHere();
    RangeCache::Counters mine;
    for (size_t p = next++; p < pieces.size() && !failed.load(); p = next++) {
      absl::Status s = CheckCancelled(cancelled);
      if (s.ok()) {
        const Piece& piece = pieces[p];
        const absl::Status guarded = GuardTorch("loading the checkpoint", [&] {
          s = LoadPiece(plan, piece, tensors[piece.tensor],
                        arena.tensors().views[piece.tensor], cache, &mine,
                        piece.check_crc ? &crcs[p] : nullptr);
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
  return CheckCrcs(plan, pieces, crcs);
}

}  // namespace materializer::load
