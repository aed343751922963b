// The fetch paths of Engine: which bytes a client gets, in which layout.

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/delivery/safetensors.h"
#include "server/engine/engine.h"

namespace materializer::engine {
namespace {

absl::Status MetaOnly(const registry::Handle& handle, v1::HandleState state) {
  if (state == v1::HANDLE_STATE_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", handle.id(),
        " has no data: its materialization failed (", handle.error(),
        "), so its tensors are still meta tensors (shapes and dtypes only) "
        "and there is nothing to copy out of them. Release it and "
        "materialize again."));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "handle ", handle.id(),
      " has no data yet: it is still materializing, so its tensors are meta "
      "tensors (shapes and dtypes only, no storage) and nothing can be "
      "copied out of them. Wait until Describe reports "
      "HANDLE_STATE_READY."));
}

}  // namespace

absl::StatusOr<std::unique_ptr<delivery::WeightStream>> Engine::OpenFetch(
    const Caller& caller, const v1::FetchRequest& request) const {
  if (request.format() != v1::WEIGHT_FORMAT_UNSPECIFIED &&
      request.format() != v1::WEIGHT_FORMAT_SAFETENSORS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: unknown format ", request.format(),
        "; this server writes WEIGHT_FORMAT_SAFETENSORS"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  const v1::HandleState state = handle->state();
  if (state != v1::HANDLE_STATE_READY) return MetaOnly(*handle, state);
  std::shared_ptr<const memory::Arena> arena = handle->arena();
  if (arena == nullptr) {  // released between Get and here
    return absl::NotFoundError(
        absl::StrCat("handle \"", request.handle(), "\" was just released"));
  }

  const registry::HandleSpec& spec = handle->spec();
  std::vector<delivery::FileTensor> entries;
  std::vector<std::pair<std::string, std::string>> metadata = {
      {"format", "pt"}};
  entries.reserve(spec.tensors.size());
  // With write_ties_once, each group of tied tensors is written once, under
  // its first included name (the root when it is included).
  std::vector<int> carrier(spec.tensors.size(), -1);
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const spec::TensorDesc& t = spec.tensors[i];
    if (!t.persistent && !request.include_non_persistent()) continue;
    const int root = t.tie_root >= 0 ? t.tie_root : static_cast<int>(i);
    if (request.write_ties_once()) {
      const bool root_included =
          spec.tensors[root].persistent || request.include_non_persistent();
      int& written = carrier[root];
      if (written < 0) written = root_included ? root : static_cast<int>(i);
      if (written != static_cast<int>(i)) {
        metadata.emplace_back(absl::StrCat("tie:", t.name),
                              spec.tensors[written].name);
        continue;
      }
    }
    delivery::FileTensor entry;
    entry.name = t.name;
    entry.dtype = t.dtype;
    entry.shape = t.shape;
    entry.nbytes = t.nbytes;
    entry.source_offset = spec.layout.offsets[i];
    entries.push_back(std::move(entry));
  }
  delivery::SafetensorsFile file =
      delivery::SafetensorsFile::Build(std::move(entries), metadata);
  return delivery::WeightStream::Open(std::move(arena), std::move(file),
                                      request.offset(), request.chunk_bytes());
}

}  // namespace materializer::engine
