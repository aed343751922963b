// matctl: the command-line client of the materializer service.
//
//   matctl plan examples/gpt2-small.json
//   matctl --client=alice materialize examples/gpt2-small.json --label="run 17"
//   matctl fetch h-0123... -o gpt2.safetensors --resume
//   matctl fetch h-0123... -o gpt2.pt --format=torch --exclude='*.inv_freq'
//
// Exit status: 0 on success, 1 when a call or a file fails, 2 on a usage
// error. Errors print as `matctl: <STATUS_CODE>: <message>` on stderr.

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/format.h"
#include "client/request_file.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, client, "",
          "identity sent to the server (insecure development mode)");
ABSL_FLAG(std::string, output, "table", "table or json");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(10),
          "deadline of each call except fetch");
ABSL_FLAG(absl::Duration, fetch_timeout, absl::InfiniteDuration(),
          "deadline of a whole fetch");
ABSL_FLAG(bool, all, false, "plan, describe: list every tensor");
ABSL_FLAG(bool, async, false, "materialize: return once memory is reserved");
ABSL_FLAG(std::string, label, "", "materialize: free-text label");
ABSL_FLAG(std::string, o, "", "fetch: the file to write");
ABSL_FLAG(bool, resume, false, "fetch: continue from OUT.partial");
ABSL_FLAG(bool, include_non_persistent, false,
          "fetch: also write non-persistent buffers");
ABSL_FLAG(std::string, chunk_bytes, "0",
          "fetch: largest chunk, e.g. 4MiB (0: the server's default)");
ABSL_FLAG(std::string, format, "safetensors",
          "fetch: safetensors, torch or raw");
ABSL_FLAG(std::vector<std::string>, include, {},
          "fetch: write only tensors matching one of these globs "
          "(comma-separated)");
ABSL_FLAG(std::vector<std::string>, exclude, {},
          "fetch: leave out tensors matching any of these globs "
          "(comma-separated)");
ABSL_FLAG(bool, write_ties_once, false,
          "fetch (safetensors): write each group of tied tensors once");
ABSL_FLAG(bool, force, false, "release: release an exported handle too");
ABSL_FLAG(absl::Duration, ttl, absl::ZeroDuration(),
          "materialize: lease of the (detached) handle, e.g. 30m; 0 = the "
          "server's default");
ABSL_FLAG(std::string, importer_device_uuid, "",
          "export: the importer's CUDA device (GPU-...), checked by the "
          "server");

namespace materializer::client {
namespace {

constexpr char kUsage[] =
    R"(usage: matctl [--server=HOST:PORT] [--client=NAME] [--output=table|json] COMMAND [ARGS]

commands:
  plan FILE.json [--all]          validate a model and show its memory plan
  materialize FILE.json [--async] [--label=TEXT] [--ttl=30m]
                                  materialize a model; prints its handle. The
                                  handle is detached: it lives until released
                                  or unused for its ttl (server default 1h)
  session FILE.json [--label=TEXT]
                                  materialize in a session and hold it until
                                  Ctrl-C or end of input; the server then
                                  releases the handle (after its grace period)
  renew HANDLE                    renew a detached handle's lease
  describe HANDLE [--all]         show a handle and its tensors
  release HANDLE [--force]        free a handle's memory (--force: even while
                                  exported)
  ls                              list your handles
  stats                           memory per device, per client (yours, or
                                  everyone's for an admin) and device, quotas
  health                          the server's serving status
  fetch HANDLE -o OUT [--format=safetensors|torch|raw] [--include=GLOBS]
        [--exclude=GLOBS] [--resume] [--include_non_persistent]
        [--write_ties_once] [--chunk_bytes=N]
                                  write a handle's weights to a file and
                                  verify its digest
  export HANDLE [--importer_device_uuid=GPU-...]
                                  zero-copy export for a co-located process
  close-export EXPORT_ID          end an export

FILE.json holds a PlanRequest or MaterializeRequest in the proto3 JSON
mapping; --async and --label override the file's fields.

flags:
  --server=HOST:PORT   server address (default 127.0.0.1:50051)
  --client=NAME        identity sent to the server (development mode)
  --output=table|json  json prints the response in the proto3 JSON mapping
  --timeout=DURATION   deadline of each call except fetch, e.g. 30s, 1h
                       (default 10m)
  --fetch_timeout=DURATION
                       deadline of a whole fetch (default: none)
  --all                plan, describe: list every tensor, not the first 20

exit status: 0 ok, 1 error, 2 usage error
)";

// Tensor tables stop here unless --all.
constexpr int kMaxTensorRows = 20;

enum class OutputMode { kTable, kJson };

// A command's arguments and global settings, already checked for usage.
struct Invocation {
  std::vector<std::string> args;
  OutputMode output = OutputMode::kTable;
  // Flags given on the command line, so a flag set to its default still
  // overrides the request file.
  std::set<std::string> flags_given;
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// "HANDLE_STATE_READY" -> "READY": the enum prefix is noise in a table.
std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  absl::string_view short_name = name;
  absl::ConsumePrefix(&short_name, prefix);
  return std::string(short_name);
}

// "8.00 KiB (8192)": readable, and still exact.
std::string BytesWithCount(uint64_t bytes) {
  if (bytes < 1024) return FormatBytes(bytes);
  return absl::StrCat(FormatBytes(bytes), " (", bytes, ")");
}

std::string ShapeOf(const google::protobuf::RepeatedField<int64_t>& shape) {
  return FormatShape(absl::MakeConstSpan(shape.data(), shape.size()));
}

std::string FormatTimestamp(const google::protobuf::Timestamp& timestamp) {
  const absl::Time time = absl::FromUnixSeconds(timestamp.seconds()) +
                          absl::Nanoseconds(timestamp.nanos());
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", time, absl::UTCTimeZone());
}

// Prints a response in the proto3 JSON mapping, default values included so
// that scripts find every field.
absl::Status PrintJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    const auto reason = status.message();
    return absl::InternalError(absl::StrCat(
        "printing ", message.GetTypeName(),
        " as JSON: ", absl::string_view(reason.data(), reason.size())));
  }
  if (!absl::EndsWith(json, "\n")) json += "\n";
  std::cout << json;
  return absl::OkStatus();
}

void PrintWarnings(
    const google::protobuf::RepeatedPtrField<std::string>& warnings) {
  if (warnings.empty()) return;
  std::cout << "\nwarnings:\n";
  for (const std::string& warning : warnings) {
    std::cout << "  " << warning << "\n";
  }
}

// Prints "... N more" under a truncated tensor table.
void PrintTruncation(int shown, int total) {
  if (shown < total) {
    std::cout << "... " << total - shown
              << " more (--all lists every tensor)\n";
  }
}

// "torch" -> WEIGHT_FORMAT_TORCH.
absl::StatusOr<v1::WeightFormat> ParseFormat(absl::string_view name) {
  if (name == "safetensors") return v1::WEIGHT_FORMAT_SAFETENSORS;
  if (name == "torch") return v1::WEIGHT_FORMAT_TORCH;
  if (name == "raw") return v1::WEIGHT_FORMAT_RAW;
  return absl::InvalidArgumentError(absl::StrCat(
      "--format must be safetensors, torch or raw, not \"", name, "\""));
}

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

absl::Status RunPlan(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::MaterializeRequest file,
                   ReadRequestFile(invocation.args[0]));
  v1::PlanRequest request;
  *request.mutable_model() = file.model();
  *request.mutable_placement() = file.placement();
  ASSIGN_OR_RETURN(const v1::PlanResponse plan, client.Plan(request));
  if (invocation.output == OutputMode::kJson) {
    return PrintJson(plan);
  }

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
  std::cout << totals.Render();

  if (!plan.by_dtype().empty()) {
    Table dtypes({"DTYPE", "TENSORS", "BYTES"});
    dtypes.SetAlign(1, Table::Align::kRight);
    dtypes.SetAlign(2, Table::Align::kRight);
    for (const v1::DtypeBytes& entry : plan.by_dtype()) {
      dtypes.AddRow({entry.dtype(), absl::StrCat(entry.tensors()),
                     FormatBytes(entry.nbytes())});
    }
    std::cout << "\n" << dtypes.Render();
  }

  if (!plan.devices().empty()) {
    Table devices({"DEVICE", "AVAILABLE", "FITS"});
    devices.SetAlign(1, Table::Align::kRight);
    for (const v1::DeviceFit& fit : plan.devices()) {
      devices.AddRow({fit.device(), FormatBytes(fit.available_bytes()),
                      fit.fits() ? "yes" : "no"});
    }
    std::cout << "\n" << devices.Render();
  }
  PrintWarnings(plan.warnings());

  if (!plan.tensors().empty()) {
    const bool all = absl::GetFlag(FLAGS_all);
    Table tensors({"NAME", "SHAPE", "DTYPE", "BYTES", "INIT"});
    tensors.SetAlign(3, Table::Align::kRight);
    int shown = 0;
    for (const v1::TensorPlan& tensor : plan.tensors()) {
      if (!all && shown == kMaxTensorRows) break;
      tensors.AddRow({tensor.name(), ShapeOf(tensor.shape()), tensor.dtype(),
                      FormatBytes(tensor.nbytes()), tensor.init()});
      ++shown;
    }
    std::cout << "\n" << tensors.Render();
    PrintTruncation(shown, plan.tensors_size());
  }
  return absl::OkStatus();
}

absl::Status RunMaterialize(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(v1::MaterializeRequest request,
                   ReadRequestFile(invocation.args[0]));
  if (invocation.flags_given.count("async") > 0) {
    request.set_async(absl::GetFlag(FLAGS_async));
  }
  if (invocation.flags_given.count("label") > 0) {
    request.set_label(absl::GetFlag(FLAGS_label));
  }
  if (const absl::Duration ttl = absl::GetFlag(FLAGS_ttl);
      ttl > absl::ZeroDuration()) {
    request.mutable_ttl()->set_seconds(absl::ToInt64Seconds(ttl));
    request.mutable_ttl()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(
            ttl - absl::Seconds(absl::ToInt64Seconds(ttl)))));
  }
  ASSIGN_OR_RETURN(const v1::MaterializeResponse response,
                   client.Materialize(request));
  if (invocation.output == OutputMode::kJson) {
    return PrintJson(response);
  }

  Table summary;
  summary.AddRow({"handle", response.handle()});
  summary.AddRow({"device", response.device()});
  summary.AddRow({"arena bytes", BytesWithCount(response.arena_bytes())});
  summary.AddRow({"tensor bytes", BytesWithCount(response.tensor_bytes())});
  summary.AddRow({"tensors", absl::StrCat(response.num_tensors())});
  summary.AddRow({"state", ShortEnumName(v1::HandleState_Name(response.state()),
                                         "HANDLE_STATE_")});
  std::cout << summary.Render();

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
  std::cout << "\n" << phases.Render();
  PrintWarnings(response.warnings());
  return absl::OkStatus();
}

std::string KindOf(const v1::TensorInfo& tensor) {
  if (tensor.kind() != v1::TENSOR_KIND_BUFFER) return "parameter";
  return tensor.persistent() ? "buffer" : "buffer (non-persistent)";
}

absl::Status RunDescribe(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::HandleInfo info,
                   client.Describe(invocation.args[0]));
  if (invocation.output == OutputMode::kJson) {
    return PrintJson(info);
  }

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
  std::cout << summary.Render();

  if (!info.tensors().empty()) {
    const bool all = absl::GetFlag(FLAGS_all);
    Table tensors(
        {"NAME", "SHAPE", "DTYPE", "KIND", "DEVICE", "BYTES", "INIT"});
    tensors.SetAlign(5, Table::Align::kRight);
    int shown = 0;
    for (const v1::TensorInfo& tensor : info.tensors()) {
      if (!all && shown == kMaxTensorRows) break;
      tensors.AddRow({tensor.name(), ShapeOf(tensor.shape()), tensor.dtype(),
                      KindOf(tensor), tensor.device(),
                      FormatBytes(tensor.nbytes()), tensor.init()});
      ++shown;
    }
    std::cout << "\n" << tensors.Render();
    PrintTruncation(shown, info.tensors_size());
  }
  return absl::OkStatus();
}

absl::Status RunRelease(Client& client, const Invocation& invocation) {
  const std::string& handle = invocation.args[0];
  ASSIGN_OR_RETURN(const v1::ReleaseResponse response,
                   client.Release(handle, absl::GetFlag(FLAGS_force)));
  if (invocation.output == OutputMode::kJson) return PrintJson(response);
  if (response.released()) {
    std::cout << "released " << handle << ", freed "
              << BytesWithCount(response.freed_bytes()) << "\n";
  } else {
    std::cout << handle << " was already released\n";
  }
  return absl::OkStatus();
}

absl::Status RunList(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::ListHandlesResponse response,
                   client.ListHandles());
  if (invocation.output == OutputMode::kJson) {
    return PrintJson(response);
  }
  if (response.handles().empty()) {
    std::cout << "no handles\n";
    return absl::OkStatus();
  }
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
  std::cout << table.Render();
  return absl::OkStatus();
}

absl::Status RunStats(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::GetStatsResponse stats, client.GetStats());
  if (invocation.output == OutputMode::kJson) {
    return PrintJson(stats);
  }

  Table devices(
      {"DEVICE", "CAPACITY", "RESERVED", "IN USE", "PEAK", "HANDLES"});
  for (size_t column = 1; column <= 5; ++column) {
    devices.SetAlign(column, Table::Align::kRight);
  }
  for (const v1::DeviceStats& device : stats.devices()) {
    devices.AddRow({device.device(), FormatBytes(device.capacity_bytes()),
                    FormatBytes(device.reserved_bytes()),
                    FormatBytes(device.in_use_bytes()),
                    FormatBytes(device.peak_bytes()),
                    absl::StrCat(device.handles())});
  }
  std::cout << devices.Render();

  // The server returns the caller's own row (every client's for an admin),
  // and none for a client holding nothing.
  std::cout << "\n";
  if (stats.clients().empty()) {
    const std::string& me = client.options().client_name;
    std::cout << "you (" << (me.empty() ? "anonymous" : me)
              << ") hold nothing\n";
  } else {
    auto quota = [](uint64_t bytes) {
      return bytes == 0 ? std::string("-") : FormatBytes(bytes);
    };
    Table clients({"CLIENT", "DEVICE", "RESERVED", "IN USE", "PEAK", "HANDLES",
                   "QUOTA", "SESSIONS"});
    for (size_t column = 2; column <= 7; ++column) {
      clients.SetAlign(column, Table::Align::kRight);
    }
    for (const v1::ClientStats& entry : stats.clients()) {
      clients.AddRow(
          {entry.client(), "all", FormatBytes(entry.reserved_bytes()),
           FormatBytes(entry.in_use_bytes()), FormatBytes(entry.peak_bytes()),
           entry.quota_handles() == 0
               ? absl::StrCat(entry.handles())
               : absl::StrCat(entry.handles(), "/", entry.quota_handles()),
           quota(entry.quota_total_bytes()), absl::StrCat(entry.sessions())});
      for (const v1::ClientDeviceStats& device : entry.devices()) {
        if (device.reserved_bytes() == 0 && device.in_use_bytes() == 0 &&
            device.peak_bytes() == 0) {
          continue;
        }
        clients.AddRow(
            {"", device.device(), FormatBytes(device.reserved_bytes()),
             FormatBytes(device.in_use_bytes()),
             FormatBytes(device.peak_bytes()), absl::StrCat(device.handles()),
             quota(device.quota_bytes()), ""});
      }
    }
    std::cout << clients.Render();
  }

  std::cout << "\nall clients: " << FormatBytes(stats.reserved_bytes())
            << " reserved, " << FormatBytes(stats.in_use_bytes()) << " in use, "
            << stats.handles()
            << (stats.handles() == 1 ? " handle" : " handles") << "\n";
  return absl::OkStatus();
}

// Holds a session: materializes FILE bound to it, prints the handle, and
// waits until stdin closes or a SIGINT/SIGTERM arrives; the session then
// ends and the server releases the handle after its grace period.
absl::Status RunSession(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(v1::MaterializeRequest request,
                   ReadRequestFile(invocation.args[0]));
  if (invocation.flags_given.count("label") > 0) {
    request.set_label(absl::GetFlag(FLAGS_label));
  }
  ASSIGN_OR_RETURN(const std::string session, client.SessionId());
  ASSIGN_OR_RETURN(const v1::MaterializeResponse response,
                   client.Materialize(request));
  if (invocation.output == OutputMode::kJson) {
    std::cout << "{\"session\": " << JsonQuote(session)
              << ", \"handle\": " << JsonQuote(response.handle()) << "}"
              << std::endl;
  } else {
    std::cout << response.handle() << std::endl;
    std::cerr << "holding " << response.handle() << " ("
              << FormatBytes(response.arena_bytes()) << " on "
              << response.device() << ") in session " << session
              << "; Ctrl-C or end of input ends it\n";
  }
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
  std::cerr << "session ended; the server releases its handles after its "
               "grace period\n";
  return absl::OkStatus();
}

absl::Status RunRenew(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::RenewResponse response,
                   client.Renew(invocation.args[0]));
  if (invocation.output == OutputMode::kJson) return PrintJson(response);
  std::cout << invocation.args[0] << " leased until "
            << google::protobuf::util::TimeUtil::ToString(
                   response.lease_expires_at())
            << "\n";
  return absl::OkStatus();
}

absl::Status RunHealth(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const std::string status, client.Health());
  if (invocation.output == OutputMode::kJson) {
    std::cout << "{\"status\": " << JsonQuote(status) << "}\n";
  } else {
    std::cout << status << "\n";
  }
  // A probe script reads the exit status; anything but SERVING is a failure
  // whose reason the line above already gave.
  if (status != "SERVING") {
    return absl::UnavailableError(absl::StrCat("the server is ", status));
  }
  return absl::OkStatus();
}

absl::Status RunFetch(Client& client, const Invocation& invocation) {
  const std::string& handle = invocation.args[0];
  const std::string path = absl::GetFlag(FLAGS_o);
  // Checked for usage before the command runs.
  const uint64_t chunk_bytes =
      ParseBytes(absl::GetFlag(FLAGS_chunk_bytes)).value();

  FetchFileOptions options;
  options.resume = absl::GetFlag(FLAGS_resume);
  // Checked for usage before the command runs.
  options.format = ParseFormat(absl::GetFlag(FLAGS_format)).value();
  options.include = absl::GetFlag(FLAGS_include);
  options.exclude = absl::GetFlag(FLAGS_exclude);
  options.write_ties_once = absl::GetFlag(FLAGS_write_ties_once);
  options.include_non_persistent = absl::GetFlag(FLAGS_include_non_persistent);
  options.chunk_bytes = static_cast<uint32_t>(chunk_bytes);

  const bool draw = isatty(STDERR_FILENO) != 0;
  bool drawn = false;
  const absl::Time start = absl::Now();
  ProgressMeter meter(start);
  options.progress = [&](uint64_t done, uint64_t total) {
    std::optional<std::string> line = meter.Update(done, total, absl::Now());
    if (draw && line.has_value()) {
      // \r returns to the line's start; ESC[K clears what a longer
      // previous line left behind.
      std::fprintf(stderr, "\r%s\x1b[K", line->c_str());
      std::fflush(stderr);
      drawn = true;
    }
  };
  const absl::StatusOr<FetchResult> result =
      FetchToFile(client, handle, path, options);
  const absl::Duration elapsed = absl::Now() - start;
  if (drawn) std::fputs("\n", stderr);
  RETURN_IF_ERROR(result.status());

  if (invocation.output == OutputMode::kJson) {
    std::cout << "{\"handle\": " << JsonQuote(handle)
              << ", \"path\": " << JsonQuote(path)
              << ", \"bytes\": " << result->total_bytes
              << ", \"digest\": " << JsonQuote(result->digest) << "}\n";
  } else {
    std::cout << "wrote " << path << ": "
              << FormatFetchSummary(result->total_bytes, meter.transferred(),
                                    elapsed)
              << "\ndigest " << result->digest << " (verified)\n";
  }
  return absl::OkStatus();
}

absl::Status RunExport(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(
      const v1::ExportResponse response,
      client.ExportHandle(invocation.args[0],
                          absl::GetFlag(FLAGS_importer_device_uuid)));
  if (invocation.output == OutputMode::kJson) return PrintJson(response);
  Table summary;
  summary.AddRow({"export", response.export_id()});
  if (response.has_shared_memory()) {
    summary.AddRow({"shared memory", response.shared_memory().path()});
  } else {
    summary.AddRow({"cuda device",
                    absl::StrCat("cuda:", response.cuda().device_ordinal(),
                                 " (", response.cuda().device_uuid(), ")")});
    summary.AddRow(
        {"base offset", absl::StrCat(response.cuda().base_offset())});
  }
  summary.AddRow({"arena bytes", BytesWithCount(response.arena_bytes())});
  summary.AddRow({"tensors", absl::StrCat(response.tensors_size())});
  std::cout << summary.Render();
  std::cout << "\nclose it with: matctl close-export " << response.export_id()
            << "\n";
  return absl::OkStatus();
}

absl::Status RunCloseExport(Client& client, const Invocation& invocation) {
  ASSIGN_OR_RETURN(const v1::CloseExportResponse response,
                   client.CloseExport(invocation.args[0]));
  if (invocation.output == OutputMode::kJson) return PrintJson(response);
  std::cout << "closed " << invocation.args[0] << "; "
            << response.remaining_exports()
            << " export(s) of its handle remain\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

struct Command {
  const char* name;
  // Positional arguments after the command name.
  size_t num_args;
  // What follows "matctl" on the usage line.
  const char* synopsis;
  // Flags that only this command accepts (besides the global ones).
  std::vector<const char*> flags;
  absl::Status (*run)(Client&, const Invocation&);
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"plan", 1, "plan FILE.json [--all]", {"all"}, RunPlan},
      {"materialize",
       1,
       "materialize FILE.json [--async] [--label=TEXT] [--ttl=30m]",
       {"async", "label", "ttl"},
       RunMaterialize},
      {"session", 1, "session FILE.json [--label=TEXT]", {"label"}, RunSession},
      {"renew", 1, "renew HANDLE", {}, RunRenew},
      {"describe", 1, "describe HANDLE [--all]", {"all"}, RunDescribe},
      {"release", 1, "release HANDLE [--force]", {"force"}, RunRelease},
      {"ls", 0, "ls", {}, RunList},
      {"stats", 0, "stats", {}, RunStats},
      {"health", 0, "health", {}, RunHealth},
      {"fetch",
       1,
       "fetch HANDLE -o OUT [--format=safetensors|torch|raw] "
       "[--include=GLOBS] [--exclude=GLOBS] [--resume] "
       "[--include_non_persistent] [--write_ties_once] [--chunk_bytes=N]",
       {"o", "resume", "include_non_persistent", "chunk_bytes", "format",
        "include", "exclude", "write_ties_once"},
       RunFetch},
      {"export",
       1,
       "export HANDLE [--importer_device_uuid=GPU-...]",
       {"importer_device_uuid"},
       RunExport},
      {"close-export", 1, "close-export EXPORT_ID", {}, RunCloseExport},
  };
  return *commands;
}

// Flags that belong to one command or another; a command rejects the
// others' flags rather than silently ignoring them.
const std::vector<const char*>& CommandFlags() {
  static const auto* flags =
      new std::vector<const char*>{"all",
                                   "async",
                                   "label",
                                   "o",
                                   "resume",
                                   "include_non_persistent",
                                   "chunk_bytes",
                                   "format",
                                   "include",
                                   "exclude",
                                   "write_ties_once",
                                   "force",
                                   "importer_device_uuid",
                                   "ttl"};
  return *flags;
}

// What the command line sets, from a scan ahead of absl::ParseCommandLine:
// that exits with status 1 on an unknown flag, which is a usage error here
// (status 2), and this Abseil release keeps "was this flag given" private.
struct FlagScan {
  // Names of the flags given; --noflag counts as flag.
  std::set<std::string> given;
  // The first argument that names no flag.
  std::optional<std::string> unknown;
};

FlagScan ScanFlags(int argc, char** argv) {
  FlagScan scan;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    absl::string_view name = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t equals = name.find('=');
    const bool has_value = equals != absl::string_view::npos;
    name = name.substr(0, equals);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    absl::string_view negated = name;
    if (flag == nullptr && absl::ConsumePrefix(&negated, "no")) {
      flag = absl::FindCommandLineFlag(negated);
      if (flag != nullptr && flag->IsOfType<bool>()) {
        scan.given.insert(std::string(negated));
        continue;
      }
      flag = nullptr;
    }
    if (flag == nullptr) {
      if (!scan.unknown.has_value()) scan.unknown = std::string(arg);
      continue;
    }
    scan.given.insert(std::string(name));
    // A non-boolean flag without "=" takes the next argument as its value.
    if (!has_value && !flag->IsOfType<bool>()) ++i;
  }
  return scan;
}

// A usage error: the reason, then the whole usage text when no command was
// recognized, or else that command's usage line.
int UsageError(absl::string_view message, const Command* command = nullptr) {
  std::cerr << "matctl: " << message << "\n";
  if (command == nullptr) {
    std::cerr << "\n" << kUsage;
  } else {
    std::cerr << "usage: matctl [FLAGS] " << command->synopsis
              << "\n(matctl --help lists every command and flag)\n";
  }
  return 2;
}

int Fail(const absl::Status& status) {
  std::cerr << "matctl: " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
  return 1;
}

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  const FlagScan flags = ScanFlags(argc, argv);
  if (flags.unknown.has_value()) {
    return UsageError(absl::StrCat("unknown flag ", *flags.unknown));
  }
  absl::SetProgramUsageMessage(kUsage);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return UsageError("no command given");
  const std::string name = positional[1];
  if (name == "help") {
    std::cout << kUsage;
    return 0;
  }

  const Command* command = nullptr;
  for (const Command& candidate : Commands()) {
    if (name == candidate.name) command = &candidate;
  }
  if (command == nullptr) {
    return UsageError(absl::StrCat("unknown command \"", name, "\""));
  }

  Invocation invocation;
  invocation.args.assign(positional.begin() + 2, positional.end());
  invocation.flags_given = flags.given;
  if (invocation.args.size() != command->num_args) {
    return UsageError(
        absl::StrCat(
            name, " takes ",
            command->num_args == 0 ? "no arguments" : "exactly one argument",
            " (got ", invocation.args.size(), ")"),
        command);
  }
  for (const char* flag : CommandFlags()) {
    if (flags.given.count(flag) == 0) continue;
    bool accepted = false;
    for (const char* own : command->flags) {
      accepted |= absl::string_view(own) == flag;
    }
    if (!accepted) {
      return UsageError(
          absl::StrCat(absl::string_view(flag).size() == 1 ? "-" : "--", flag,
                       " does not apply to ", name),
          command);
    }
  }

  const std::string output = absl::GetFlag(FLAGS_output);
  if (output == "json") {
    invocation.output = OutputMode::kJson;
  } else if (output != "table") {
    return UsageError(
        absl::StrCat("--output must be table or json, not \"", output, "\""),
        command);
  }
  if (absl::GetFlag(FLAGS_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_fetch_timeout) <= absl::ZeroDuration()) {
    return UsageError("--timeout and --fetch_timeout must be positive",
                      command);
  }
  if (name == "fetch") {
    if (absl::GetFlag(FLAGS_o).empty()) {
      return UsageError("fetch needs -o OUT", command);
    }
    if (const absl::StatusOr<v1::WeightFormat> format =
            ParseFormat(absl::GetFlag(FLAGS_format));
        !format.ok()) {
      return UsageError(format.status().message(), command);
    }
    const absl::StatusOr<uint64_t> chunk_bytes =
        ParseBytes(absl::GetFlag(FLAGS_chunk_bytes));
    if (!chunk_bytes.ok()) {
      return UsageError(
          absl::StrCat("--chunk_bytes: ", chunk_bytes.status().message()),
          command);
    }
    if (*chunk_bytes > std::numeric_limits<uint32_t>::max()) {
      return UsageError("--chunk_bytes does not fit in 32 bits", command);
    }
  }

  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.client_name = absl::GetFlag(FLAGS_client);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.fetch_timeout = absl::GetFlag(FLAGS_fetch_timeout);
  // One-shot commands leave detached handles (living by their lease);
  // `session` holds a session for as long as it runs.
  options.session = std::string(command->name) == "session";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  const absl::Status status = command->run(**client, invocation);
  if (!status.ok()) return Fail(status);
  return 0;
}

}  // namespace
}  // namespace materializer::client

int main(int argc, char** argv) {
  return materializer::client::Main(argc, argv);
}
