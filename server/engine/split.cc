#include "server/engine/split.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::engine {
namespace {

uint64_t Padded(uint64_t bytes) {
  return (bytes + spec::kArenaAlignment - 1) / spec::kArenaAlignment *
         spec::kArenaAlignment;
}

// Finds, for a tensor name, the longest no_split entry it lies under, in
// time linear in the name: the hashes of all the name's prefixes come from
// one pass, and each prefix that ends at a component boundary is one table
// lookup. Hashes are polynomials modulo the prime 2^61 - 1 at a base drawn
// at random per request, so two different strings share a hash with
// probability at most 512 / 2^61 whatever the client sends; a hit is still
// confirmed by comparing the strings.
class NoSplitIndex {
 public:
  explicit NoSplitIndex(const std::vector<std::string>& prefixes)
      : base_(RandomBase()) {
    for (const std::string& prefix : prefixes) {
      by_hash_[Hash(prefix)].push_back(&prefix);
    }
  }

  // The longest entry that equals `name` or is followed in it by '.'.
  const std::string* LongestUnder(absl::string_view name) {
    if (by_hash_.empty()) return nullptr;
    prefix_hashes_.resize(name.size() + 1);
    prefix_hashes_[0] = 0;
    for (size_t i = 0; i < name.size(); ++i) {
      prefix_hashes_[i + 1] = Add(MulMod(prefix_hashes_[i], base_),
                                  static_cast<unsigned char>(name[i]) + 1);
    }
    for (size_t end = name.size() + 1; end-- > 0;) {
      if (end != name.size() && name[end] != '.') continue;
      auto it = by_hash_.find(prefix_hashes_[end]);
      if (it == by_hash_.end()) continue;
      for (const std::string* prefix : it->second) {
        if (*prefix == name.substr(0, end)) return prefix;
      }
    }
    return nullptr;
  }

 private:
  static constexpr uint64_t kPrime = (uint64_t{1} << 61) - 1;

  static uint64_t RandomBase() {
    absl::BitGen bits;
    return absl::Uniform<uint64_t>(bits, 1u << 20, kPrime - 1);
  }
  static uint64_t MulMod(uint64_t a, uint64_t b) {
    const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
    uint64_t folded = static_cast<uint64_t>(product & kPrime) +
                      static_cast<uint64_t>(product >> 61);
    while (folded >= kPrime) folded -= kPrime;
    return folded;
  }
  static uint64_t Add(uint64_t a, uint64_t b) {
    const uint64_t sum = a + b;
    return sum >= kPrime ? sum - kPrime : sum;
  }
  uint64_t Hash(absl::string_view text) const {
    uint64_t h = 0;
    for (char c : text) {
      h = Add(MulMod(h, base_), static_cast<unsigned char>(c) + 1);
    }
    return h;
  }

  const uint64_t base_;
  absl::flat_hash_map<uint64_t, std::vector<const std::string*>> by_hash_;
  std::vector<uint64_t> prefix_hashes_;
};

}  // namespace

absl::StatusOr<SplitUnits> GroupForSplit(
    const std::vector<spec::TensorDesc>& tensors,
    const std::vector<std::string>& no_split) {
  if (no_split.size() > kMaxNoSplit) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.split.no_split: ", no_split.size(),
                     " prefixes; the limit is ", kMaxNoSplit));
  }
  for (size_t k = 0; k < no_split.size(); ++k) {
    if (no_split[k].size() > kMaxNoSplitBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement.split.no_split[", k, "] (", Quote(no_split[k]), "): ",
          no_split[k].size(), " bytes; the limit is ", kMaxNoSplitBytes));
    }
  }
  NoSplitIndex index_of_prefix(no_split);
  SplitUnits units;
  units.unit_of_tensor.assign(tensors.size(), -1);
  absl::flat_hash_map<std::string, int> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) continue;
    const std::string& name = tensors[i].name;
    std::string key;
    if (const std::string* prefix = index_of_prefix.LongestUnder(name)) {
      key = *prefix;
    } else if (const size_t dot = name.rfind('.'); dot != std::string::npos) {
      key = name.substr(0, dot);
    }
    auto [it, inserted] = index.emplace(std::move(key), units.names.size());
    if (inserted) {
      units.names.push_back(it->first.empty() ? "(root module)" : it->first);
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
  if (static_cast<size_t>(split.max_memory_size()) > kMaxMemoryEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.split.max_memory: ", split.max_memory_size(),
                     " entries; the limit is ", kMaxMemoryEntries));
  }
  for (const auto& [device, text] : split.max_memory()) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement.split.max_memory[", Quote(device),
                       "]: ", bytes.status().message()));
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
