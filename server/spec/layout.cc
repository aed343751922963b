#include "server/spec/layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/spec/validate.h"

namespace materializer::spec {

absl::StatusOr<Layout> ComputeLayout(const std::vector<TensorDesc>& tensors) {
  Layout layout;
  layout.offsets.reserve(tensors.size());
  uint64_t cursor = 0;
  for (const TensorDesc& t : tensors) {
    if (t.tie_root >= 0) {
      // Shares its root's bytes. Roots come first in the chain, but not
      // necessarily in the list: the offset is filled in below.
      layout.offsets.push_back(0);
      continue;
    }
    layout.offsets.push_back(cursor);
    // Each nbytes < 2^63 and cursor < 2^63, so the sum cannot wrap.
    const uint64_t end = cursor + t.nbytes;
    const uint64_t padded =
        (end + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    if (end > kMaxTensorBytes || padded > kMaxTensorBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.tensors: the tensors together take more than 2^63-1 bytes "
          "(exceeded at \"",
          t.name, "\")"));
    }
    cursor = padded;
    layout.tensor_bytes += t.nbytes;
    layout.num_elements += t.numel;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tie_root >= 0) {
      layout.offsets[i] = layout.offsets[tensors[i].tie_root];
    }
  }
  layout.arena_bytes = cursor;
  return layout;
}

}  // namespace materializer::spec
