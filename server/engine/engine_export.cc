// The export paths of Engine: zero-copy access to a handle's memory for a
// co-located process (docs/delivery.md, "Export").

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/engine/engine.h"
#include "server/memory/arena.h"

namespace materializer::engine {
namespace {

// Export ids name their handle: "x-<32 hex>-h-<32 hex>", so CloseExport
// finds the handle without a table of its own (and still finds it after a
// forced release).
constexpr absl::string_view kHandleMark = "-h-";

// ReleaseRequest.close_exports: far more than one importer needs, and a
// bound on the work one Release asks for.
constexpr int kMaxExportsClosedPerRelease = 64;

std::string NewExportId(absl::string_view handle_id) {
  // NewHandleId is "h-" and 128 random bits.
  return absl::StrCat("x-", registry::NewHandleId().substr(2), "-",
                      handle_id);
}

absl::StatusOr<std::string> HandleOfExport(absl::string_view export_id) {
  const size_t at = export_id.find(kHandleMark);
  if (!absl::StartsWith(export_id, "x-") || at == absl::string_view::npos) {
    return absl::NotFoundError(absl::StrCat(
        "export ", Quote(export_id), " not found (it is not an export id)"));
  }
  return std::string(export_id.substr(at + 1));
}

}  // namespace

absl::StatusOr<v1::ExportResponse> Engine::ExportHandle(
    const Caller& caller, const v1::ExportRequest& request) {
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  return Export(caller, handle, request.importer_device_uuid());
}

absl::StatusOr<v1::ExportResponse> Engine::Export(
    const Caller& caller, const std::shared_ptr<registry::Handle>& handle,
    const std::string& importer_device_uuid) {
  const v1::HandleState state = handle->state();
  if (state != v1::HANDLE_STATE_READY) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", handle->id(), " is not READY (",
        v1::HandleState_Name(state),
        "): only initialized memory can be exported"));
  }
  std::shared_ptr<const memory::Arena> arena = handle->arena();
  if (arena == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("handle \"", handle->id(), "\" was just released"));
  }

  v1::ExportResponse response;
  registry::ExportRecord record;
  record.id = NewExportId(handle->id());
  record.opened = absl::Now();
  if (arena->num_parts() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", handle->id(), " is split across devices (",
        handle->spec().device, "); exports cover one device's memory"));
  }
  if (arena->device().kind == memory::DeviceKind::kCpu) {
    if (!arena->shared_memory()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "handle ", handle->id(), " is on ", arena->device().name,
          " in private memory, which another process cannot map. "
          "Materialize it with exportable: true (MaterializeRequest."
          "exportable) to allocate it in shared memory, or fetch it"));
    }
    v1::SharedMemoryExport* shm = response.mutable_shared_memory();
    for (const memory::SharedMemorySegment& segment :
         arena->shared_memory_segments()) {
      v1::SharedMemorySegment* out = shm->add_segments();
      out->set_path(segment.path);
      out->set_offset(segment.offset);
      out->set_bytes(segment.bytes);
    }
    shm->set_path(arena->shared_memory_segments().front().path);
  } else {
    // Check the device before handing out anything: an IPC handle opens
    // only on the device that holds the memory.
    ASSIGN_OR_RETURN(memory::CudaIpcInfo ipc, arena->ExportCudaIpc());
    if (!importer_device_uuid.empty() &&
        importer_device_uuid != ipc.device_uuid) {
      return absl::FailedPreconditionError(absl::StrCat(
          "handle ", handle->id(), " is on ", arena->device().name, " (",
          ipc.device_uuid, "), but the importer's device is ",
          Quote(importer_device_uuid),
          ": a CUDA IPC handle opens only on the device that holds the "
          "memory. Materialize on the importer's device (placement "
          "\"cuda:N\"), or fetch the weights instead"));
    }
    v1::CudaIpcExport* cuda = response.mutable_cuda();
    cuda->set_ipc_handle(ipc.ipc_handle.data(), ipc.ipc_handle.size());
    cuda->set_device_ordinal(ipc.device_ordinal);
    cuda->set_device_uuid(ipc.device_uuid);
    cuda->set_base_offset(ipc.base_offset);
    record.arena = arena;  // kept until CloseExport, even past a release
  }
  response.set_export_id(record.id);
  response.set_arena_bytes(arena->bytes());
  const registry::HandleSpec& spec = handle->spec();
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const spec::TensorDesc& t = spec.tensors[i];
    v1::ExportedTensor* out = response.add_tensors();
    out->set_name(t.name);
    out->set_dtype(spec::Name(t.dtype));
    out->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    out->set_offset(spec.layout.offsets[i]);
    out->set_nbytes(t.nbytes);
  }
  ASSIGN_OR_RETURN(uint32_t live, handle->AddExport(std::move(record)));
  if (options_.metrics != nullptr) {
    options_.metrics->RecordExportOpened(response.has_cuda() ? "cuda_ipc"
                                                             : "shared_memory");
  }
  MLOG(INFO) << "exported " << handle->id() << " to " << caller.identity
             << " as " << response.export_id() << " (" << live << " live)";
  return response;
}

absl::StatusOr<v1::CloseExportResponse> Engine::CloseExport(
    const Caller& caller, const v1::CloseExportRequest& request) {
  ASSIGN_OR_RETURN(const std::string handle_id,
                   HandleOfExport(request.export_id()));
  absl::StatusOr<std::shared_ptr<registry::Handle>> handle =
      registry_->GetExported(caller.identity, handle_id);
  if (!handle.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "export ", Quote(request.export_id()),
        " not found (it was closed already, or it belongs to another "
        "client)"));
  }
  ASSIGN_OR_RETURN(uint32_t remaining,
                   (*handle)->CloseExport(request.export_id()));
  registry_->ExportClosed(handle_id);
  if (options_.metrics != nullptr) options_.metrics->RecordExportClosed();
  // Use renews the lease, so a handle that was exported past its lease
  // does not vanish the moment its export closes.
  (*handle)->Renew(absl::Now());
  v1::CloseExportResponse response;
  response.set_remaining_exports(remaining);
  return response;
}

absl::StatusOr<uint32_t> Engine::CloseExportsOf(
    const Caller& caller, const v1::ReleaseRequest& request) {
  const auto& ids = request.close_exports();
  if (ids.empty()) return 0;
  if (ids.size() > kMaxExportsClosedPerRelease) {
    return absl::InvalidArgumentError(
        absl::StrCat("close_exports: ", ids.size(), " ids; the limit is ",
                     kMaxExportsClosedPerRelease));
  }
  for (int i = 0; i < ids.size(); ++i) {
    absl::StatusOr<std::string> owner = HandleOfExport(ids[i]);
    if (!owner.ok() || *owner != request.handle()) {
      // Neither the id nor the handle is quoted: this is checked before
      // anyone's handle is looked up, and an id names its handle, so the
      // answer to another client's handle must not repeat it.
      return absl::InvalidArgumentError(absl::StrCat(
          "close_exports[", i,
          "]: not an export of the handle being released (an export id "
          "ends with its handle's id)"));
    }
    for (int j = 0; j < i; ++j) {
      if (ids[j] == ids[i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "close_exports[", i, "]: the same id as close_exports[", j, "]"));
      }
    }
  }
  absl::StatusOr<std::shared_ptr<registry::Handle>> handle =
      registry_->GetExported(caller.identity, request.handle());
  // Not the caller's handle, or gone: the release that follows says which.
  if (!handle.ok()) return 0;
  uint32_t closed = 0;
  for (const std::string& id : ids) {
    // NOT_FOUND: closed already (a repeated Release), which is fine.
    if ((*handle)->CloseExport(id).ok()) {
      ++closed;
      if (options_.metrics != nullptr) options_.metrics->RecordExportClosed();
    }
  }
  if (closed > 0) registry_->ExportClosed(request.handle());
  return closed;
}

}  // namespace materializer::engine
