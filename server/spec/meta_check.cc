#include "server/spec/meta_check.h"

#include <ATen/ops/empty.h>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/spec/torch_dtype.h"

namespace materializer::spec {

absl::Status CheckAgainstMetaTensors(const std::vector<TensorDesc>& tensors,
                                     const Cancelled& cancelled) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i % kCancelPollInterval == 0) RETURN_IF_ERROR(CheckCancelled(cancelled));
    const TensorDesc& t = tensors[i];
    at::Tensor meta;
    RETURN_IF_ERROR(GuardTorch(absl::StrCat("meta tensor \"", t.name, "\""),
                               [&] {
                                 meta = at::empty(
                                     t.shape, at::TensorOptions()
                                                  .dtype(ToScalarType(t.dtype))
                                                  .device(at::kMeta));
                               }));
    if (static_cast<uint64_t>(meta.numel()) != t.numel ||
        meta.nbytes() != t.nbytes || !meta.is_contiguous()) {
      return absl::InternalError(absl::StrCat(
          "meta tensor \"", t.name, "\" disagrees with the planner: numel ",
          meta.numel(), " vs ", t.numel, ", nbytes ", meta.nbytes(), " vs ",
          t.nbytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace materializer::spec
