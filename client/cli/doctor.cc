#include "client/cli/doctor.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/render.h"
#include "client/format.h"
#include "server/common/units.h"

namespace materializer::client::cli {
namespace {

bool IsCuda(const v1::DeviceStats& device) {
  return absl::StartsWith(device.device(), "cuda");
}

std::string LedgerLine(const v1::DeviceStats& device) {
  return absl::StrCat(FormatBytes(device.capacity_bytes()), " capacity, ",
                      FormatBytes(device.reserved_bytes()), " reserved, ",
                      FormatBytes(device.in_use_bytes()), " in use, ",
                      device.handles(),
                      device.handles() == 1 ? " handle" : " handles");
}

// Bytes the driver counts on the device that neither this server nor a
// listed process accounts for.
uint64_t Unlisted(const v1::DriverMemory& driver) {
  uint64_t accounted = driver.server_process_bytes();
  for (const v1::GpuProcess& process : driver.processes()) {
    accounted += process.used_bytes();
  }
  return driver.used_bytes() > accounted ? driver.used_bytes() - accounted : 0;
}

std::string StateCell(const v1::GpuProcess& process) {
  if (process.state() == "defunct") return "DEFUNCT (zombie)";
  if (process.state() == "gone") return "GONE (not visible here)";
  return process.state().empty() ? "?" : process.state();
}

void FindingsOf(const std::string& where, const v1::DeviceStats& device,
                std::vector<std::string>* findings) {
  const v1::DriverMemory& driver = device.driver();
  for (const v1::GpuProcess& process : driver.processes()) {
    const std::string who = absl::StrCat(
        "process ", process.pid(),
        process.name().empty() ? std::string()
                               : absl::StrCat(" (", process.name(), ")"));
    if (process.state() == "defunct") {
      findings->push_back(absl::StrCat(
          where, ": ", device.device(), ": ", who,
          " is defunct and still "
          "holds ",
          FormatBytes(process.used_bytes()),
          ": the memory returns when its parent reaps it (or the parent "
          "exits)"));
    } else if (process.state() == "gone") {
      findings->push_back(absl::StrCat(
          where, ": ", device.device(), ": ", who,
          " is not visible to the "
          "server but the driver counts ",
          FormatBytes(process.used_bytes()),
          " for it: a process of another container, or one that exited "
          "while its memory is still held"));
    }
  }
  if (driver.processes().empty()) {
    const uint64_t outside = Unlisted(driver);
    if (outside > 0) {
      findings->push_back(absl::StrCat(
          where, ": ", device.device(), ": ", FormatBytes(outside),
          " is held outside this server; the process list is shown to admin "
          "identities (materializerd --admin_clients)"));
    }
  }
}

void RenderDevice(const v1::DeviceStats& device, std::string* out) {
  const v1::DriverMemory& driver = device.driver();
  absl::StrAppend(out, "  ", device.device());
  if (!driver.name().empty()) absl::StrAppend(out, "  ", driver.name());
  if (!driver.uuid().empty()) absl::StrAppend(out, "  ", driver.uuid());
  absl::StrAppend(out, "\n");
  Table rows;
  if (!device.has_driver()) {
    rows.AddRow({"    driver",
                 "figures unavailable (the server could not "
                 "load NVML)"});
  } else {
    rows.AddRow({"    driver",
                 absl::StrCat(FormatBytes(driver.total_bytes()), " total, ",
                              FormatBytes(driver.used_bytes()), " used, ",
                              FormatBytes(driver.free_bytes()), " free")});
    rows.AddRow({"    this server",
                 absl::StrCat(FormatBytes(driver.server_process_bytes()),
                              " as the driver counts it; LibTorch's caching "
                              "allocator holds ",
                              FormatBytes(driver.caching_allocator_bytes()))});
  }
  rows.AddRow({"    ledger", LedgerLine(device)});
  *out += rows.Render();
  if (!device.has_driver()) return;
  if (driver.processes().empty()) {
    const uint64_t outside = Unlisted(driver);
    absl::StrAppend(
        out, "    other processes: ",
        outside == 0
            ? std::string("none")
            : absl::StrCat("none listed, but ", FormatBytes(outside),
                           " is held outside this server (the list is shown "
                           "to admin identities)"),
        "\n");
    return;
  }
  Table processes({"      PID", "NAME", "USED", "STATE"});
  processes.SetAlign(0, Table::Align::kRight);
  processes.SetAlign(2, Table::Align::kRight);
  for (const v1::GpuProcess& process : driver.processes()) {
    processes.AddRow({absl::StrCat(process.pid()),
                      process.name().empty() ? "-" : process.name(),
                      FormatBytes(process.used_bytes()), StateCell(process)});
  }
  absl::StrAppend(out, "    other processes:\n", processes.Render());
}

}  // namespace

std::vector<std::string> DoctorFindings(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas) {
  std::vector<std::string> findings;
  for (const FromReplica<v1::GetStatsResponse>& replica : replicas) {
    const std::string where = ReplicaLabel(replica.replica, replica.address);
    if (!replica.result.ok()) {
      findings.push_back(absl::StrCat(
          where, " did not answer: ", replica.result.status().message()));
      continue;
    }
    for (const v1::DeviceStats& device : replica.result->devices()) {
      if (IsCuda(device) && device.has_driver()) {
        FindingsOf(where, device, &findings);
      }
    }
  }
  return findings;
}

std::string RenderDoctor(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas) {
  std::string out;
  for (const FromReplica<v1::GetStatsResponse>& replica : replicas) {
    if (!out.empty()) out += "\n";
    absl::StrAppend(&out, ReplicaLabel(replica.replica, replica.address), "\n");
    if (!replica.result.ok()) {
      absl::StrAppend(
          &out, "  did not answer: ", replica.result.status().message(), "\n");
      continue;
    }
    std::vector<std::string> others;
    bool any_gpu = false;
    for (const v1::DeviceStats& device : replica.result->devices()) {
      if (IsCuda(device)) {
        any_gpu = true;
        RenderDevice(device, &out);
      } else {
        others.push_back(absl::StrCat(device.device(),
                                      " (ledger: ", LedgerLine(device), ")"));
      }
    }
    if (!any_gpu) {
      absl::StrAppend(&out, "  no GPU on this server; its devices: ",
                      absl::StrJoin(others, ", "), "\n");
    } else if (!others.empty()) {
      absl::StrAppend(&out, "  also: ", absl::StrJoin(others, ", "), "\n");
    }
  }
  const std::vector<std::string> findings = DoctorFindings(replicas);
  absl::StrAppend(&out, "\n",
                  findings.empty() ? "findings: none" : "findings:", "\n");
  for (const std::string& finding : findings) {
    absl::StrAppend(&out, "  - ", finding, "\n");
  }
  return out;
}

JsonObject DoctorJson(
    const std::vector<FromReplica<v1::GetStatsResponse>>& replicas) {
  std::vector<JsonObject> entries;
  for (const FromReplica<v1::GetStatsResponse>& replica : replicas) {
    JsonObject entry;
    entry.Str("replica", replica.replica).Str("address", replica.address);
    if (replica.result.ok()) {
      entry.Message("stats", *replica.result);
    } else {
      entry.Object("error", StatusJson(replica.result.status()));
    }
    entries.push_back(std::move(entry));
  }
  JsonObject out;
  out.Array("replicas", entries).Strings("findings", DoctorFindings(replicas));
  return out;
}

}  // namespace materializer::client::cli
