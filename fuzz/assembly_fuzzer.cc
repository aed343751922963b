// Fuzz target: checkpoint assemblies and key rules against a checkpoint
// (load::PlanLoad; CheckpointSource.assemblies, docs/checkpoints.md). The
// input bytes build a request against a fixed in-memory checkpoint: the
// model's tensor (rank 0-3, its dtype, whole or one shard of it), a second
// tensor, and assemblies whose keys, boxes and dims come from the bytes
// (negative, huge and zero values included), sometimes with a key rule.
//
// Properties:
//   - an error is INVALID_ARGUMENT naming a field ("checkpoint.") or a
//     tensor ("tensor "), never a crash, an overflow or another code;
//   - an accepted plan gives each assembled tensor one source per part,
//     each a box inside its checkpoint tensor and inside the tensor, the
//     two boxes equal once their size-1 dims are left out, of a dtype the
//     policy casts; and the boxes cover every element of the tensor
//     exactly once (counted here element by element);
//   - a tensor neither assembled nor found keeps its init (no sources).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "fuzz/check.h"
#include "materializer/v1/materializer.pb.h"
#include "server/load/checkpoint_files.h"
#include "server/load/checkpoint_load.h"
#include "server/spec/dtype.h"
#include "server/spec/tensor_desc.h"

namespace materializer::fuzz {
namespace {

using load::Checkpoint;
using load::CheckpointEntry;
using load::LoadSource;
using spec::DType;
using spec::TensorDesc;

// Bytes the input gives, then zeros.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Next() { return at_ < size_ ? data_[at_++] : 0; }
  // Mostly small sizes and offsets; sometimes a value no box may take.
  int64_t Dim() {
    const uint8_t b = Next();
    switch (b >> 5) {
      case 7:
        return (b & 1) ? -1 - (b & 0x0f) : (int64_t{1} << 62) + (b & 0x0f);
      default:
        return b % 7;
    }
  }
  std::vector<int64_t> Dims(int max_rank) {
    const int rank = Next() % (max_rank + 1);
    std::vector<int64_t> dims;
    for (int d = 0; d < rank; ++d) dims.push_back(Dim());
    return dims;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Never read: PlanLoad opens files and reads headers only.
class NoFile : public load::FileSource {
 public:
  const load::FileKey& key() const override { return key_; }
  const std::string& label() const override { return label_; }
  absl::Status ReadAt(uint64_t, uint64_t, void*) const override {
    return absl::InternalError("read");
  }
  absl::Status Check() const override { return absl::OkStatus(); }

 private:
  load::FileKey key_;
  std::string label_ = "fuzz/model.safetensors";
};

std::shared_ptr<const Checkpoint> MakeCheckpoint() {
  auto ckpt = std::make_shared<Checkpoint>();
  ckpt->path = "fuzz/model.safetensors";
  ckpt->files.push_back(std::make_unique<NoFile>());
  ckpt->formats.push_back("safetensors");
  const struct {
    const char* key;
    DType dtype;
    std::vector<int64_t> shape;
  } stored[] = {{"a", DType::kFloat32, {4, 6}},    {"b", DType::kBFloat16, {6, 4}},
                {"c", DType::kFloat32, {2, 3, 4}}, {"d", DType::kFloat32, {24}},
                {"s", DType::kFloat32, {}},         {"z", DType::kFloat32, {0, 3}},
                {"i", DType::kInt32, {2, 2}},      {"e", DType::kFloat32, {1, 4, 1}}};
  uint64_t offset = 0;
  for (const auto& s : stored) {
    CheckpointEntry entry;
    entry.key = s.key;
    entry.dtype = s.dtype;
    entry.shape = s.shape;
    entry.offset = offset;
    uint64_t numel = 1;
    for (int64_t d : s.shape) numel *= static_cast<uint64_t>(d);
    entry.nbytes = numel * spec::ItemSize(s.dtype);
    offset += entry.nbytes;
    ckpt->entry_of_key[entry.key] = static_cast<int>(ckpt->entries.size());
    ckpt->entries.push_back(entry);
  }
  return ckpt;
}

class FixedOpener : public load::CheckpointOpener {
 public:
  absl::StatusOr<std::shared_ptr<const Checkpoint>> Open(
      const std::string&, const std::string&) const override {
    return checkpoint_;
  }

 private:
  std::shared_ptr<const Checkpoint> checkpoint_ = MakeCheckpoint();
};

const char* const kKeys[] = {"a", "b", "c", "d", "s", "z", "i", "e", "nope"};
const char* const kTensors[] = {"t", "u", "missing"};

TensorDesc MakeTensor(const std::string& name, Bytes& in) {
  TensorDesc t;
  t.name = name;
  const int rank = in.Next() % 4;
  std::vector<int64_t> full;
  for (int d = 0; d < rank; ++d) full.push_back(1 + in.Next() % 5);
  t.dtype = (in.Next() % 5 == 0) ? DType::kInt32 : DType::kFloat32;
  t.shape = full;
  if (rank > 0 && in.Next() % 3 == 0) {
    // One block of a split along one dim, as ApplyShards makes it.
    const int dim = in.Next() % rank;
    const int64_t count = 1 + in.Next() % 3;
    const int64_t block = (full[dim] + count - 1) / count;
    const int64_t index = in.Next() % count;
    const int64_t start = std::min(full[dim], index * block);
    t.shard_full_shape = full;
    t.shard_offset.assign(rank, 0);
    t.shard_offset[dim] = start;
    t.shape[dim] = std::min(full[dim], start + block) - start;
  }
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= static_cast<uint64_t>(d);
  t.nbytes = t.numel * spec::ItemSize(t.dtype);
  return t;
}

std::vector<int64_t> WithoutOnes(const std::vector<int64_t>& shape) {
  std::vector<int64_t> out;
  for (int64_t s : shape) {
    if (s != 1) out.push_back(s);
  }
  return out;
}

void CheckPlan(const v1::CheckpointSource& source,
               const std::vector<TensorDesc>& tensors, const Checkpoint& ckpt,
               const load::LoadPlan& plan) {
  FUZZ_CHECK(plan.sources_of_tensor.size() == tensors.size());
  for (int a = 0; a < source.assemblies_size(); ++a) {
    const v1::TensorAssembly& assembly = source.assemblies(a);
    int i = -1;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (tensors[k].name == assembly.tensor()) i = static_cast<int>(k);
    }
    FUZZ_CHECK(i >= 0) << "an assembly of an unknown tensor was accepted";
    const TensorDesc& t = tensors[i];
    const std::vector<LoadSource>& sources = plan.sources_of_tensor[i];
    FUZZ_CHECK(static_cast<int>(sources.size()) == assembly.parts_size());
    const std::vector<int64_t>& full = t.full_shape();
    uint64_t numel = 1;
    for (int64_t d : full) numel *= static_cast<uint64_t>(d);
    FUZZ_CHECK(numel <= 4096);
    std::vector<int> covered(numel, 0);
    for (const LoadSource& s : sources) {
      const CheckpointEntry& entry = ckpt.entries[s.entry];
      FUZZ_CHECK(s.key_offset.size() == entry.shape.size() &&
                 s.key_shape.size() == entry.shape.size());
      for (size_t d = 0; d < entry.shape.size(); ++d) {
        FUZZ_CHECK(s.key_offset[d] >= 0 && s.key_shape[d] >= 1 &&
                   s.key_offset[d] + s.key_shape[d] <= entry.shape[d])
            << "a box outside checkpoint key " << entry.key;
      }
      FUZZ_CHECK(s.offset.size() == full.size() && s.shape.size() == full.size());
      FUZZ_CHECK(WithoutOnes(s.shape) == WithoutOnes(s.key_shape));
      FUZZ_CHECK(entry.dtype == t.dtype || (spec::Info(entry.dtype).is_floating_point &&
                                            spec::Info(t.dtype).is_floating_point));
      // Every element of the box, counted.
      std::vector<int64_t> index(full.size(), 0);
      bool done = false;
      while (!done) {
        uint64_t flat = 0;
        for (size_t d = 0; d < full.size(); ++d) {
          const int64_t at = s.offset[d] + index[d];
          FUZZ_CHECK(at >= 0 && at < full[d]) << "a box outside tensor " << t.name;
          flat = flat * static_cast<uint64_t>(full[d]) + static_cast<uint64_t>(at);
        }
        ++covered[flat];
        int d = static_cast<int>(full.size()) - 1;
        while (d >= 0 && ++index[d] == s.shape[d]) index[d--] = 0;
        done = d < 0;
      }
    }
    for (uint64_t e = 0; e < numel; ++e) {
      FUZZ_CHECK(covered[e] == 1)
          << "element " << e << " of " << t.name << " covered " << covered[e]
          << " times";
    }
    FUZZ_CHECK(plan.loaded_descriptions[i].find("assembled from") != std::string::npos);
  }
}

}  // namespace
}  // namespace materializer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace materializer;
  using namespace materializer::fuzz;
  static const FixedOpener* opener = new FixedOpener();
  Bytes in(data, size);
  std::vector<spec::TensorDesc> tensors = {MakeTensor("t", in), MakeTensor("u", in)};
  v1::CheckpointSource source;
  source.set_path("fuzz/model.safetensors");
  if (in.Next() % 4 == 0) source.set_dtype_policy(v1::CHECKPOINT_DTYPE_POLICY_EXACT);
  if (in.Next() % 5 == 0) {
    v1::KeyRule* rule = source.add_key_rules();
    rule->set_from(kTensors[in.Next() % 3]);
    rule->set_to(kKeys[in.Next() % 9]);
  }
  const int assemblies = in.Next() % 4;
  for (int a = 0; a < assemblies; ++a) {
    v1::TensorAssembly* assembly = source.add_assemblies();
    assembly->set_tensor(kTensors[in.Next() % 3]);
    const int parts = in.Next() % 9;
    for (int p = 0; p < parts; ++p) {
      v1::AssemblyPart* part = assembly->add_parts();
      part->set_key(kKeys[in.Next() % 9]);
      const uint8_t form = in.Next();
      if (form & 1) {
        for (int64_t v : in.Dims(3)) part->add_key_offset(v);
        for (int64_t v : in.Dims(3)) part->add_key_shape(v);
      }
      for (int64_t v : in.Dims(3)) part->add_offset(v);
      if (form & 2) {
        for (int64_t v : in.Dims(4)) part->add_shape(v);
      }
    }
  }
  absl::StatusOr<load::LoadPlan> plan =
      load::PlanLoad(source, tensors, *opener, "fuzz");
  if (!plan.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()))
        << "an error other than INVALID_ARGUMENT: " << plan.status();
    const std::string message(plan.status().message());
    FUZZ_CHECK(absl::StartsWith(message, "checkpoint.") ||
               absl::StartsWith(message, "tensor "))
        << "an error that names no field or tensor: " << message;
    return 0;
  }
  CheckPlan(source, tensors, *plan->checkpoint, *plan);
  for (size_t i = 0; i < tensors.size(); ++i) {
    bool named = false;
    for (const auto& a : source.assemblies()) named |= a.tensor() == tensors[i].name;
    if (!named && plan->sources_of_tensor[i].empty()) {
      FUZZ_CHECK(plan->loaded_descriptions[i].empty());
    }
  }
  return 0;
}
