#ifndef MATERIALIZER_SERVER_LOAD_CHECKPOINT_LOAD_H_
#define MATERIALIZER_SERVER_LOAD_CHECKPOINT_LOAD_H_

// Tensors from a checkpoint into a handle's arena (MaterializeRequest.
// checkpoint; docs/checkpoints.md). Two steps, so that every decision is
// made before any memory is reserved:
//
//   // Before reservation: open the files, read their indexes, match keys.
//   ASSIGN_OR_RETURN(LoadPlan plan,
//                    PlanLoad(request.checkpoint(), tensors, roots, identity));
//   ... ResolveInits(model, tensors, cancelled, &plan.loaded_descriptions) ...
//   // After allocation, before the inits run (a derived init may read a
//   // loaded tensor's values):
//   RETURN_IF_ERROR(LoadTensors(plan, tensors, arena, cache, &report));
//
// A tensor found in the checkpoint comes from it: its stored shape must be
// the tensor's full shape, and its dtype the tensor's or (policy CAST) a
// floating dtype cast to it, rounded to nearest, ties to even (torch's
// cast). A tensor the request assembles (CheckpointSource.assemblies)
// comes from the boxes of the checkpoint tensors it names, which must tile
// it. A shard reads only the bytes of its box. Tied tensors share their
// root's bytes and are not looked up. The rest keep their inits.
//
// Thread-compatible: a LoadPlan is used by one request; the cache is
// thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/cancel.h"
#include "server/load/checkpoint_files.h"
#include "server/load/range_cache.h"
#include "server/memory/arena.h"
#include "server/spec/tensor_desc.h"

namespace materializer::load {

// Where one box of a tensor comes from: a box of one checkpoint entry
// holding the same elements in the same row-major order (the two shapes are
// equal once their size-1 dims are left out). A tensor stored whole under
// its key has one source spanning both; an assembled tensor (a stacked
// mixture-of-experts weight) has one per part.
struct LoadSource {
  // Index into checkpoint->entries.
  int entry = -1;
  // The box in the entry's dims.
  std::vector<int64_t> key_offset;
  std::vector<int64_t> key_shape;
  // The box in the tensor's full dims.
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
};

struct LoadPlan {
  // The opened checkpoint: its files and their tensors.
  std::shared_ptr<const Checkpoint> checkpoint;
  // Per tensor of the request: where its boxes come from; empty for a
  // tensor the checkpoint does not fill.
  std::vector<std::vector<LoadSource>> sources_of_tensor;
  // Per tensor: what Describe says of a loaded tensor ("checkpoint
  // models/gpt2/model.safetensors at byte 1024, bfloat16 cast to
  // float32"), "" for the others. ResolveInits skips the loaded ones.
  std::vector<std::string> loaded_descriptions;
  // Checkpoint keys no tensor maps to, sorted.
  std::vector<std::string> unused_keys;
  uint32_t tensors_loaded = 0;
  // Of tensors_loaded, those built from CheckpointSource.assemblies.
  uint32_t tensors_assembled = 0;
};

// At most this many key rules (SAM 3's tracker, saved by save_pretrained,
// needs 255), and this many bytes of their `from` prefixes in all.
inline constexpr int kMaxKeyRules = 1024;
inline constexpr uint64_t kMaxKeyRuleFromBytes = uint64_t{64} << 10;
// At most this many assembly parts per tensor, and in one request (a
// DeepSeek-V3-shaped model stored one expert per key needs 44,544).
inline constexpr int kMaxPartsPerTensor = 4096;
inline constexpr int kMaxAssemblyParts = 131072;

// The checkpoint key of tensor `name` under `rules` (the first rule whose
// `from` is a prefix of the name replaces it; none keeps the name).
std::string MapKey(
    const google::protobuf::RepeatedPtrField<v1::KeyRule>& rules,
    const std::string& name);

// Opens `source` for `identity` and matches the request's tensors to its
// keys. INVALID_ARGUMENT naming the field, file or tensor for: bad rules, a
// key two tensors map to, a stored shape that is not the tensor's, a dtype
// the policy does not cast, an assembly whose boxes do not tile its tensor
// or run past a checkpoint tensor, missing tensors under require_all
// (listed);
// the roots' statuses (checkpoint_files.h) for the path.
absl::StatusOr<LoadPlan> PlanLoad(const v1::CheckpointSource& source,
                                  const std::vector<spec::TensorDesc>& tensors,
                                  const CheckpointOpener& opener,
                                  const std::string& identity);

// Writes every loaded tensor's bytes (its box, for a shard) into its arena
// view, cast to its dtype, reading through `cache`. Adds what it read to
// `report`. FAILED_PRECONDITION naming the file if a file changed on disk
// since PlanLoad; CANCELLED once `cancelled` says so.
absl::Status LoadTensors(const LoadPlan& plan,
                         const std::vector<spec::TensorDesc>& tensors,
                         memory::Arena& arena, RangeCache& cache,
                         v1::CheckpointReport* report,
                         const Cancelled& cancelled);

}  // namespace materializer::load

#endif  // MATERIALIZER_SERVER_LOAD_CHECKPOINT_LOAD_H_
