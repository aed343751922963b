#ifndef MATERIALIZER_CLIENT_EXPORT_TORCH_H_
#define MATERIALIZER_CLIENT_EXPORT_TORCH_H_

// An ExportImport's tensors as at::Tensors over the mapped memory (no
// copy). Each tensor holds a reference to the import, so the mapping lives
// as long as any of them.
//
//   ASSIGN_OR_RETURN(auto import, ExportImport::Open(exported));
//   ASSIGN_OR_RETURN(auto state_dict, ViewAsTensors(import));
//   model->load_state_dict-like code reads state_dict["fc.weight"] ...
//
// A read-only CPU import gives tensors whose in-place ops fault: open it
// with `writable` (copy-on-write) if the tensors will be modified.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "client/export_import.h"

namespace materializer::client {

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ViewAsTensors(
    std::shared_ptr<const ExportImport> import);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_EXPORT_TORCH_H_
