// describe, release, renew, ls, export, close-export: the commands that
// name a handle (or list them).

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/hints.h"
#include "client/cli/render.h"
#include "client/format.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::client::cli {
namespace {

std::string KindOf(const v1::TensorInfo& tensor) {
  if (tensor.kind() != v1::TENSOR_KIND_BUFFER) return "parameter";
  return tensor.persistent() ? "buffer" : "buffer (non-persistent)";
}

void PrintHandleInfo(std::ostream& out, const v1::HandleInfo& info, bool all) {
  Table summary;
  summary.AddRow({"handle", info.handle()});
  summary.AddRow({"state", ShortEnumName(v1::HandleState_Name(info.state()),
                                         "HANDLE_STATE_")});
  summary.AddRow({"owner", info.owner()});
  if (!info.label().empty()) summary.AddRow({"label", info.label()});
  summary.AddRow({"device", info.device()});
  if (info.has_created_at()) {
    summary.AddRow({"created", FormatTimestamp(info.created_at())});
  }
  summary.AddRow({"arena bytes", BytesWithCount(info.arena_bytes())});
  summary.AddRow({"tensor bytes", BytesWithCount(info.tensor_bytes())});
  summary.AddRow({"seed", absl::StrCat(info.seed())});
  summary.AddRow(
      {"rng", ShortEnumName(v1::RngMode_Name(info.rng()), "RNG_MODE_")});
  if (!info.error().empty()) summary.AddRow({"error", info.error()});
  if (!info.digest().empty()) {
    // Per-tensor values are in --output=json (docs/delivery.md).
    summary.AddRow({"digest", info.digest()});
    summary.AddRow(
        {"fingerprint", absl::StrFormat("%016x", info.fingerprint())});
  }
  out << summary.Render();
  if (info.tensors().empty()) return;
  Table tensors({"NAME", "SHAPE", "DTYPE", "KIND", "DEVICE", "BYTES", "INIT"});
  tensors.SetAlign(5, Table::Align::kRight);
  int shown = 0;
  for (const v1::TensorInfo& tensor : info.tensors()) {
    if (!all && shown == kMaxTensorRows) break;
    tensors.AddRow({tensor.name(), ShapeOf(tensor.shape()), tensor.dtype(),
                    KindOf(tensor), tensor.device(),
                    FormatBytes(tensor.nbytes()), tensor.init()});
    ++shown;
  }
  out << "\n" << tensors.Render();
  PrintTruncation(out, shown, info.tensors_size());
}

}  // namespace

absl::Status RunDescribe(Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::HandleInfo info,
                   invocation.client().Describe(invocation.arg(0)));
  if (invocation.json()) {
    PrintJson(invocation.out(), info);
  } else {
    PrintHandleInfo(invocation.out(), info, invocation.flags().Bool("all"));
  }
  return absl::OkStatus();
}

absl::Status RunRelease(Invocation& invocation) {
  const std::string& handle = invocation.arg(0);
  ASSIGN_OR_RETURN(
      const v1::ReleaseResponse response,
      invocation.client().Release(handle, invocation.flags().Bool("force")));
  if (invocation.json()) {
    PrintJson(invocation.out(), response);
  } else if (response.released()) {
    invocation.out() << "released " << handle << ", freed "
                     << BytesWithCount(response.freed_bytes()) << "\n";
  } else {
    invocation.out() << handle << " was already released\n";
  }
  return absl::OkStatus();
}

absl::Status RunRenew(Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::RenewResponse response,
                   invocation.client().Renew(invocation.arg(0)));
  if (invocation.json()) {
    PrintJson(invocation.out(), response);
  } else {
    invocation.out() << invocation.arg(0) << " leased until "
                     << FormatTimestamp(response.lease_expires_at()) << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunList(Invocation& invocation) {
  ASSIGN_OR_RETURN(const HandleList list, invocation.client().ListHandles());
  const v1::ListHandlesResponse& response = list.handles;
  std::ostream& out = invocation.out();
  if (invocation.json()) {
    PrintJson(out, response);
  } else if (response.handles().empty()) {
    out << "no handles\n";
  } else {
    Table table(
        {"HANDLE", "STATE", "DEVICE", "ARENA", "TENSORS", "CREATED", "LABEL"});
    table.SetAlign(3, Table::Align::kRight);
    table.SetAlign(4, Table::Align::kRight);
    for (const v1::HandleSummary& handle : response.handles()) {
      table.AddRow(
          {handle.handle(),
           ShortEnumName(v1::HandleState_Name(handle.state()), "HANDLE_STATE_"),
           handle.device(), FormatBytes(handle.arena_bytes()),
           absl::StrCat(handle.num_tensors()),
           handle.has_created_at() ? FormatTimestamp(handle.created_at()) : "",
           handle.label()});
    }
    out << table.Render();
  }
  if (list.failed.empty()) return absl::OkStatus();
  // The list is incomplete: say which replicas are missing, and fail so a
  // script cannot mistake it for all of them.
  std::vector<std::string> silent;
  for (const FromReplica<v1::ListHandlesResponse>& failed : list.failed) {
    silent.push_back(ReplicaLabel(failed.replica, failed.address));
    invocation.err() << "matctl: warning: " << silent.back()
                     << " is missing from the list: "
                     << failed.result.status().message() << "\n";
  }
  return WithSilentReplicas(
      absl::UnavailableError(absl::StrCat(
          absl::StrJoin(silent, ", "),
          " did not answer; the list holds the handles of the others")),
      silent);
}

absl::Status RunExport(Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::ExportResponse response,
                   invocation.client().ExportHandle(
                       invocation.arg(0),
                       invocation.flags().String("importer_device_uuid")));
  if (invocation.json()) {
    PrintJson(invocation.out(), response);
    return absl::OkStatus();
  }
  Table summary;
  summary.AddRow({"export", response.export_id()});
  if (response.has_shared_memory()) {
    const auto& segments = response.shared_memory().segments();
    if (segments.size() <= 1) {
      summary.AddRow({"shared memory", response.shared_memory().path()});
    } else {
      // The arena is these files back to back (a server's pool).
      for (const auto& segment : segments) {
        summary.AddRow({"shared memory",
                        absl::StrCat(segment.path(), " @ ", segment.offset(),
                                     " (", segment.bytes(), " bytes)")});
      }
    }
  } else {
    summary.AddRow({"cuda device",
                    absl::StrCat("cuda:", response.cuda().device_ordinal(),
                                 " (", response.cuda().device_uuid(), ")")});
    summary.AddRow(
        {"base offset", absl::StrCat(response.cuda().base_offset())});
  }
  summary.AddRow({"arena bytes", BytesWithCount(response.arena_bytes())});
  summary.AddRow({"tensors", absl::StrCat(response.tensors_size())});
  invocation.out() << summary.Render() << "\nclose it with: matctl "
                   << "close-export " << response.export_id() << "\n";
  return absl::OkStatus();
}

absl::Status RunCloseExport(Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::CloseExportResponse response,
                   invocation.client().CloseExport(invocation.arg(0)));
  if (invocation.json()) {
    PrintJson(invocation.out(), response);
  } else {
    invocation.out() << "closed " << invocation.arg(0) << "; "
                     << response.remaining_exports()
                     << " export(s) of its handle remain\n";
  }
  return absl::OkStatus();
}

}  // namespace materializer::client::cli
