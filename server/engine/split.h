#ifndef MATERIALIZER_SERVER_ENGINE_SPLIT_H_
#define MATERIALIZER_SERVER_ENGINE_SPLIT_H_

// Placement "split": cutting a model at module boundaries and laying out
// the parts, one arena per device. Pure arithmetic over tensor
// descriptions; the pool decides which part goes where.
//
//   ASSIGN_OR_RETURN(SplitUnits units, GroupForSplit(tensors, no_split));
//   ... pool.ReserveSplit(client, request with units.bytes) ...
//   ASSIGN_OR_RETURN(PartLayouts parts,
//                    LayoutParts(tensors, part_of_tensor, num_parts));

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/memory/pool.h"
#include "server/spec/layout.h"
#include "server/spec/tensor_desc.h"

namespace materializer::engine {

// Most `no_split` entries a request may list, and the longest (a tensor
// name's limit).
inline constexpr size_t kMaxNoSplit = 65536;
inline constexpr size_t kMaxNoSplitBytes = 512;
// Most `max_memory` entries (one per device is all that is useful).
inline constexpr size_t kMaxMemoryEntries = 1024;

// Groups of tensors that stay together, in order of first appearance: a
// tensor belongs to the longest `no_split` prefix it is under (the prefix
// itself or "prefix.*"), else to its module (its name without the last
// component). A tied tensor goes with its root and adds no bytes.
struct SplitUnits {
  std::vector<std::string> names;
  // Arena bytes of each unit (its tensors, each padded to the alignment).
  std::vector<uint64_t> bytes;
  std::vector<int> unit_of_tensor;
};
// Linear in the total length of the names and prefixes. INVALID_ARGUMENT
// for more than kMaxNoSplit prefixes or one longer than kMaxNoSplitBytes.
absl::StatusOr<SplitUnits> GroupForSplit(
    const std::vector<spec::TensorDesc>& tensors,
    const std::vector<std::string>& no_split);

// The pool request for `placement.split`: devices, byte caps (sizes such
// as "20GiB" or byte counts), the units. INVALID_ARGUMENT naming the field,
// or for more than kMaxMemoryEntries caps.
absl::StatusOr<memory::DevicePool::SplitRequest> MakeSplitRequest(
    const v1::SplitPlacement& split, const SplitUnits& units);

struct PartLayouts {
  // Arena offsets over all parts (part p starts at bases[p]); what the
  // handle's spec records.
  spec::Layout global;
  std::vector<uint64_t> bases;
  // Per part: its tensors (copies, ties renumbered within the part) and
  // their layout inside the part's own arena.
  std::vector<std::vector<spec::TensorDesc>> tensors;
  std::vector<spec::Layout> layouts;
  // Tensor i is tensors[part_of_tensor[i]][local_index[i]].
  std::vector<int> part_of_tensor;
  std::vector<int> local_index;
};
absl::StatusOr<PartLayouts> LayoutParts(
    const std::vector<spec::TensorDesc>& tensors,
    const std::vector<int>& part_of_tensor, int num_parts);

}  // namespace materializer::engine

#endif  // MATERIALIZER_SERVER_ENGINE_SPLIT_H_
