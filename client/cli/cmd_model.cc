// plan, materialize, session: the commands that send a model.

#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/render.h"
#include "client/request_file.h"
#include "client/format.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::client::cli {
namespace {

void PrintPlanTables(std::ostream& out, const v1::PlanResponse& plan,
                     bool all) {
  Table totals;
  totals.AddRow({"tensors", absl::StrCat(plan.tensors_size())});
  totals.AddRow({"tensor bytes", BytesWithCount(plan.tensor_bytes())});
  totals.AddRow(
      {"arena bytes", absl::StrCat(BytesWithCount(plan.arena_bytes()),
                                   ", alignment ", plan.alignment())});
  totals.AddRow({"elements", absl::StrCat(plan.num_elements())});
  if (!plan.largest_tensor().empty()) {
    totals.AddRow(
        {"largest tensor",
         absl::StrCat(plan.largest_tensor(), " (",
                      FormatBytes(plan.largest_tensor_bytes()), ")")});
  }
  totals.AddRow({"placement", plan.placement().empty()
                                  ? "(fits on no device now)"
                                  : plan.placement()});
  out << totals.Render();

  if (!plan.by_dtype().empty()) {
    Table dtypes({"DTYPE", "TENSORS", "BYTES"});
    dtypes.SetAlign(1, Table::Align::kRight);
    dtypes.SetAlign(2, Table::Align::kRight);
    for (const v1::DtypeBytes& entry : plan.by_dtype()) {
      dtypes.AddRow({entry.dtype(), absl::StrCat(entry.tensors()),
                     FormatBytes(entry.nbytes())});
    }
    out << "\n" << dtypes.Render();
  }
  if (!plan.devices().empty()) {
    Table devices({"DEVICE", "AVAILABLE", "FITS"});
    devices.SetAlign(1, Table::Align::kRight);
    for (const v1::DeviceFit& fit : plan.devices()) {
      devices.AddRow({fit.device(), FormatBytes(fit.available_bytes()),
                      fit.fits() ? "yes" : "no"});
    }
    out << "\n" << devices.Render();
  }
  PrintWarnings(out, plan.warnings());
  if (!plan.tensors().empty()) {
    Table tensors({"NAME", "SHAPE", "DTYPE", "BYTES", "INIT"});
    tensors.SetAlign(3, Table::Align::kRight);
    int shown = 0;
    for (const v1::TensorPlan& tensor : plan.tensors()) {
      if (!all && shown == kMaxTensorRows) break;
      tensors.AddRow({tensor.name(), ShapeOf(tensor.shape()), tensor.dtype(),
                      FormatBytes(tensor.nbytes()), tensor.init()});
      ++shown;
    }
    out << "\n" << tensors.Render();
    PrintTruncation(out, shown, plan.tensors_size());
  }
}

void PrintMaterialized(std::ostream& out,
                       const v1::MaterializeResponse& response) {
  Table summary;
  summary.AddRow({"handle", response.handle()});
  summary.AddRow({"device", response.device()});
  summary.AddRow({"arena bytes", BytesWithCount(response.arena_bytes())});
  summary.AddRow({"tensor bytes", BytesWithCount(response.tensor_bytes())});
  summary.AddRow({"tensors", absl::StrCat(response.num_tensors())});
  summary.AddRow({"state", ShortEnumName(v1::HandleState_Name(response.state()),
                                         "HANDLE_STATE_")});
  out << summary.Render();

  const v1::PhaseTimings& timings = response.timings();
  Table phases({"PHASE", "MS"});
  phases.SetAlign(1, Table::Align::kRight);
  phases.AddRow({"validate", FormatMillis(timings.validate_us())});
  phases.AddRow({"plan", FormatMillis(timings.plan_us())});
  phases.AddRow({"reserve", FormatMillis(timings.reserve_us())});
  phases.AddRow({"allocate", FormatMillis(timings.allocate_us())});
  phases.AddRow({"init", FormatMillis(timings.init_us())});
  phases.AddRow({"register", FormatMillis(timings.register_us())});
  phases.AddRow({"total", FormatMillis(timings.total_us())});
  out << "\n" << phases.Render();
  PrintWarnings(out, response.warnings());
}

}  // namespace

absl::Status RunPlan(Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::MaterializeRequest file,
                   ReadRequestFile(invocation.arg(0)));
  v1::PlanRequest request;
  *request.mutable_model() = file.model();
  *request.mutable_placement() = file.placement();
  ASSIGN_OR_RETURN(const v1::PlanResponse plan,
                   invocation.client().Plan(request));
  if (invocation.json()) {
    PrintJson(invocation.out(), plan);
  } else {
    PrintPlanTables(invocation.out(), plan, invocation.flags().Bool("all"));
  }
  return absl::OkStatus();
}

absl::Status RunMaterialize(Invocation& invocation) {
  ASSIGN_OR_RETURN(v1::MaterializeRequest request,
                   ReadRequestFile(invocation.arg(0)));
  const FlagValues& flags = invocation.flags();
  // A flag given on the command line wins over the file, even when it says
  // the default.
  if (flags.Has("async")) request.set_async(flags.Bool("async"));
  if (flags.Has("label")) request.set_label(flags.String("label"));
  if (flags.Has("checkpoint")) {
    request.mutable_checkpoint()->set_path(flags.String("checkpoint"));
  }
  if (flags.Has("ttl")) {
    const absl::Duration ttl = flags.Duration("ttl", absl::ZeroDuration());
    const int64_t seconds = absl::ToInt64Seconds(ttl);
    request.mutable_ttl()->set_seconds(seconds);
    request.mutable_ttl()->set_nanos(static_cast<int32_t>(
        absl::ToInt64Nanoseconds(ttl - absl::Seconds(seconds))));
  }
  ASSIGN_OR_RETURN(const v1::MaterializeResponse response,
                   invocation.client().Materialize(request));
  if (invocation.json()) {
    PrintJson(invocation.out(), response);
  } else {
    PrintMaterialized(invocation.out(), response);
  }
  return absl::OkStatus();
}

// Files and tensors of a checkpoint under the server's roots: the first 20
// tensors unless --all.
absl::Status RunInspect(Invocation& invocation) {
  v1::InspectCheckpointRequest request;
  request.set_path(invocation.arg(0));
  request.set_digest(invocation.flags().Bool("digest"));
  ASSIGN_OR_RETURN(const v1::CheckpointContents contents,
                   invocation.client().InspectCheckpoint(request));
  std::ostream& out = invocation.out();
  if (invocation.json()) {
    PrintJson(out, contents);
    return absl::OkStatus();
  }
  Table files({"FILE", "FORMAT", "BYTES", "DIGEST"});
  files.SetAlign(2, Table::Align::kRight);
  for (const v1::CheckpointFile& f : contents.files()) {
    files.AddRow({f.path(), f.format(), FormatBytes(f.bytes()),
                  f.digest().empty() ? "-" : f.digest()});
  }
  out << files.Render() << "\n";
  Table tensors({"KEY", "DTYPE", "SHAPE", "BYTES", "FILE", "OFFSET"});
  tensors.SetAlign(3, Table::Align::kRight);
  tensors.SetAlign(5, Table::Align::kRight);
  const bool all = invocation.flags().Bool("all");
  constexpr int kShown = 20;
  int shown = 0;
  for (const v1::CheckpointEntryInfo& t : contents.tensors()) {
    if (!all && shown == kShown) break;
    ++shown;
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    tensors.AddRow({t.key(), t.dtype(), FormatShape(shape),
                    FormatBytes(t.nbytes()), absl::StrCat(t.file()),
                    absl::StrCat(t.offset())});
  }
  out << tensors.Render();
  if (shown < contents.tensors_size()) {
    out << "... " << contents.tensors_size() - shown
        << " more (--all lists every tensor)\n";
  }
  out << contents.tensors_size()
      << (contents.tensors_size() == 1 ? " tensor, " : " tensors, ")
      << FormatBytes(contents.tensor_bytes()) << " in "
      << contents.files_size() << (contents.files_size() == 1 ? " file" : " files")
      << "\n";
  return absl::OkStatus();
}

// Holds a session: materializes FILE bound to it, prints the handle, and
// waits until stdin closes or a SIGINT/SIGTERM arrives; the session then
// ends and the server releases the handle after its grace period.
absl::Status RunSession(Invocation& invocation) {
  ASSIGN_OR_RETURN(v1::MaterializeRequest request,
                   ReadRequestFile(invocation.arg(0)));
  if (invocation.flags().Has("label")) {
    request.set_label(invocation.flags().String("label"));
  }
  ASSIGN_OR_RETURN(const v1::MaterializeResponse response,
                   invocation.client().Materialize(request));
  ASSIGN_OR_RETURN(const std::string session,
                   invocation.client().SessionIdOf(response.handle()));
  if (invocation.json()) {
    JsonObject out;
    out.Str("session", session).Str("handle", response.handle());
    PrintJson(invocation.out(), out);
  } else {
    invocation.out() << response.handle() << "\n";
    invocation.err() << "holding " << response.handle() << " ("
                     << FormatBytes(response.arena_bytes()) << " on "
                     << response.device() << ") in session " << session
                     << "; Ctrl-C or end of input ends it\n";
  }
  invocation.out().flush();
  // Wait for SIGINT/SIGTERM (blocked and taken here) or stdin's end.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread stdin_watch([] {
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    kill(getpid(), SIGTERM);
  });
  stdin_watch.detach();
  int signal = 0;
  sigwait(&signals, &signal);
  invocation.err() << "session ended; the server releases its handles after "
                      "its grace period\n";
  return absl::OkStatus();
}

}  // namespace materializer::client::cli
