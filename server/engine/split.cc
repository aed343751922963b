#include "server/engine/split.h"

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::engine {
namespace {

uint64_t Padded(uint64_t bytes) {
  return (bytes + spec::kArenaAlignment - 1) / spec::kArenaAlignment *
         spec::kArenaAlignment;
}

std::string UnitKey(const std::string& name,
                    const std::vector<std::string>& no_split) {
  const std::string* best = nullptr;
  for (const std::string& prefix : no_split) {
    if ((name == prefix || absl::StartsWith(name, prefix + ".")) &&
        (best == nullptr || prefix.size() > best->size())) {
      best = &prefix;
    }
  }
  if (best != nullptr) return *best;
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

}  // namespace

SplitUnits GroupForSplit(const std::vector<spec::TensorDesc>& tensors,
                         const std::vector<std::string>& no_split) {
  SplitUnits units;
  units.unit_of_tensor.assign(tensors.size(), -1);
  std::map<std::string, int> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) continue;
    const std::string key = UnitKey(tensors[i].name, no_split);
    auto [it, inserted] = index.emplace(key, units.names.size());
    if (inserted) {
      units.names.push_back(key.empty() ? "(root module)" : key);
      units.bytes.push_back(0);
    }
    units.unit_of_tensor[i] = it->second;
    units.bytes[it->second] += Padded(tensors[i].nbytes);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) {
      units.unit_of_tensor[i] = units.unit_of_tensor[tensors[i].tie_root];
    }
  }
  return units;
}

absl::StatusOr<memory::DevicePool::SplitRequest> MakeSplitRequest(
    const v1::SplitPlacement& split, const SplitUnits& units) {
  memory::DevicePool::SplitRequest request;
  request.devices.assign(split.devices().begin(), split.devices().end());
  for (const auto& [device, text] : split.max_memory()) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement.split.max_memory[\"", device,
                       "\"]: ", bytes.status().message()));
    }
    request.max_memory.emplace(device, *bytes);
  }
  request.unit_bytes = units.bytes;
  request.unit_names = units.names;
  return request;
}

absl::StatusOr<PartLayouts> LayoutParts(
    const std::vector<spec::TensorDesc>& tensors,
    const std::vector<int>& part_of_tensor, int num_parts) {
  PartLayouts out;
  out.tensors.resize(num_parts);
  out.part_of_tensor = part_of_tensor;
  out.local_index.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<spec::TensorDesc>& part = out.tensors[part_of_tensor[i]];
    out.local_index[i] = static_cast<int>(part.size());
    part.push_back(tensors[i]);
  }
  // Ties point at their root's index within the part (same part by
  // construction).
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root < 0) continue;
    spec::TensorDesc& tied = out.tensors[part_of_tensor[i]][out.local_index[i]];
    tied.tie_root = out.local_index[tensors[i].tie_root];
  }
  uint64_t base = 0;
  for (int p = 0; p < num_parts; ++p) {
    ASSIGN_OR_RETURN(spec::Layout layout, spec::ComputeLayout(out.tensors[p]));
    out.bases.push_back(base);
    base += layout.arena_bytes;
    out.global.tensor_bytes += layout.tensor_bytes;
    out.global.num_elements += layout.num_elements;
    out.layouts.push_back(std::move(layout));
  }
  out.global.arena_bytes = base;
  out.global.offsets.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int p = part_of_tensor[i];
    out.global.offsets[i] = out.bases[p] + out.layouts[p].offsets[out.local_index[i]];
  }
  return out;
}

}  // namespace materializer::engine
