// stats, doctor, health, replicas: the commands about the servers
// themselves, one section (or row) per replica.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "client/cli/doctor.h"
#include "client/cli/hints.h"
#include "client/cli/render.h"
#include "client/format.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::client::cli {
namespace {

// UNAVAILABLE naming the replicas that failed, after the output of those
// that answered, so a script sees the result is incomplete. When some
// answered, the status carries those that did not (WithSilentReplicas), for
// the hint.
template <typename T>
absl::Status MissingReplicas(const std::vector<FromReplica<T>>& each) {
  if (each.size() == 1) return each[0].result.status();
  std::vector<std::string> missing;
  std::vector<std::string> silent;
  bool any_answered = false;
  for (const FromReplica<T>& entry : each) {
    if (entry.result.ok()) {
      any_answered = true;
      continue;
    }
    const std::string label = ReplicaLabel(entry.replica, entry.address);
    missing.push_back(
        absl::StrCat(label, ": ", entry.result.status().message()));
    const absl::StatusCode code = entry.result.status().code();
    if (code == absl::StatusCode::kUnavailable ||
        code == absl::StatusCode::kDeadlineExceeded) {
      silent.push_back(label);
    } else {
      any_answered = true;  // it answered, with a refusal
    }
  }
  if (missing.empty()) return absl::OkStatus();
  // The first one's code: UNAVAILABLE for a replica that did not answer,
  // UNAUTHENTICATED for one that refused us, ...
  for (const FromReplica<T>& entry : each) {
    if (!entry.result.ok()) {
      absl::Status status(entry.result.status().code(),
                          absl::StrJoin(missing, "; "));
      return any_answered ? WithSilentReplicas(std::move(status), silent)
                          : status;
    }
  }
  return absl::OkStatus();
}

void PrintStats(std::ostream& out, const v1::GetStatsResponse& stats,
                const std::string& me) {
  // Pages of released handles that trainers still map (the co-located
  // load hands them over): a column of their own while there are any, so
  // that memory counted against capacity and quotas is never unexplained.
  const bool handed_over = stats.handed_over_bytes() > 0;
  std::vector<std::string> device_header = {"DEVICE", "CAPACITY", "RESERVED",
                                            "IN USE", "PEAK", "HANDLES"};
  if (handed_over) device_header.push_back("HANDED OVER");
  Table devices(device_header);
  for (size_t column = 1; column < device_header.size(); ++column) {
    devices.SetAlign(column, Table::Align::kRight);
  }
  for (const v1::DeviceStats& device : stats.devices()) {
    std::vector<std::string> row = {
        device.device(), FormatBytes(device.capacity_bytes()),
        FormatBytes(device.reserved_bytes()), FormatBytes(device.in_use_bytes()),
        FormatBytes(device.peak_bytes()), absl::StrCat(device.handles())};
    if (handed_over) row.push_back(FormatBytes(device.handed_over_bytes()));
    devices.AddRow(row);
  }
  out << devices.Render() << "\n";
  // The server returns the caller's own row (every client's for an admin),
  // and none for a client holding nothing.
  if (stats.clients().empty()) {
    out << (me.empty() ? std::string("you") : absl::StrCat("you (", me, ")"))
        << " hold nothing\n";
  } else {
    auto quota = [](uint64_t bytes) {
      return bytes == 0 ? std::string("-") : FormatBytes(bytes);
    };
    std::vector<std::string> client_header = {
        "CLIENT", "DEVICE", "RESERVED", "IN USE", "PEAK", "HANDLES", "QUOTA",
        "SESSIONS"};
    if (handed_over) client_header.push_back("HANDED OVER");
    Table clients(client_header);
    for (size_t column = 2; column < client_header.size(); ++column) {
      clients.SetAlign(column, Table::Align::kRight);
    }
    for (const v1::ClientStats& entry : stats.clients()) {
      std::vector<std::string> row = {
          entry.client(), "all", FormatBytes(entry.reserved_bytes()),
          FormatBytes(entry.in_use_bytes()), FormatBytes(entry.peak_bytes()),
          entry.quota_handles() == 0
              ? absl::StrCat(entry.handles())
              : absl::StrCat(entry.handles(), "/", entry.quota_handles()),
          quota(entry.quota_total_bytes()), absl::StrCat(entry.sessions())};
      if (handed_over) row.push_back(FormatBytes(entry.handed_over_bytes()));
      clients.AddRow(row);
      for (const v1::ClientDeviceStats& device : entry.devices()) {
        if (device.reserved_bytes() == 0 && device.in_use_bytes() == 0 &&
            device.peak_bytes() == 0 && device.handed_over_bytes() == 0) {
          continue;
        }
        std::vector<std::string> device_row = {
            "", device.device(), FormatBytes(device.reserved_bytes()),
            FormatBytes(device.in_use_bytes()), FormatBytes(device.peak_bytes()),
            absl::StrCat(device.handles()), quota(device.quota_bytes()), ""};
        if (handed_over) {
          device_row.push_back(FormatBytes(device.handed_over_bytes()));
        }
        clients.AddRow(device_row);
      }
    }
    out << clients.Render();
  }
  out << "\nall clients: " << FormatBytes(stats.reserved_bytes())
      << " reserved, " << FormatBytes(stats.in_use_bytes()) << " in use, "
      << stats.handles() << (stats.handles() == 1 ? " handle" : " handles")
      << "\n";
  if (stats.handed_over_bytes() > 0) {
    out << "handed over: " << FormatBytes(stats.handed_over_bytes())
        << " of released handles still mapped by the processes that loaded "
           "them (counted against capacity and quotas until they let go)\n";
  }
  // The server's own memory, charged to no client.
  if (stats.has_checkpoint_cache()) {
    const v1::CheckpointCacheStats& cache = stats.checkpoint_cache();
    out << "checkpoint cache: " << FormatBytes(cache.cached_bytes()) << " of "
        << FormatBytes(cache.capacity_bytes()) << "\n";
  }
  if (stats.has_shm_pool()) {
    const v1::SharedMemoryPoolStats& pool = stats.shm_pool();
    out << "shared-memory pool: " << FormatBytes(pool.bytes()) << " resident, "
        << "target " << FormatBytes(pool.target_bytes())
        << (pool.adaptive() ? " (adaptive, up to " : " (fixed, max ")
        << FormatBytes(pool.max_bytes()) << ")";
    if (!pool.last_error().empty()) {
      out << "; last refill failed: " << pool.last_error();
    }
    out << "\n";
  }
}

}  // namespace

absl::Status RunStats(Invocation& invocation) {
  ASSIGN_OR_RETURN(const auto each, invocation.client().GetStats());
  if (each.size() == 1) RETURN_IF_ERROR(each[0].result.status());
  std::ostream& out = invocation.out();
  if (invocation.json()) {
    std::vector<JsonObject> entries;
    for (const auto& entry : each) {
      JsonObject json;
      json.Str("replica", entry.replica).Str("address", entry.address);
      if (entry.result.ok()) {
        json.Message("stats", *entry.result);
      } else {
        json.Object("error", StatusJson(entry.result.status()));
      }
      entries.push_back(std::move(json));
    }
    JsonObject all;
    all.Array("replicas", entries);
    PrintJson(out, all);
    return MissingReplicas(each);
  }
  const ClientOptions& options = invocation.client().options();
  // Under TLS the identity is the certificate's or the token's, which only
  // the server knows.
  const std::string me =
      options.security.UsesTls()
          ? std::string()
          : (options.client_name.empty() ? std::string("anonymous")
                                         : options.client_name);
  for (size_t i = 0; i < each.size(); ++i) {
    if (each.size() > 1) {
      out << (i > 0 ? "\n" : "")
          << "== " << ReplicaLabel(each[i].replica, each[i].address) << "\n";
    }
    if (each[i].result.ok()) {
      PrintStats(out, *each[i].result, me);
    } else {
      out << "did not answer: " << each[i].result.status().message() << "\n";
    }
  }
  return MissingReplicas(each);
}

absl::Status RunDoctor(Invocation& invocation) {
  ASSIGN_OR_RETURN(const auto each, invocation.client().GetStats());
  if (each.size() == 1) RETURN_IF_ERROR(each[0].result.status());
  if (invocation.json()) {
    PrintJson(invocation.out(), DoctorJson(each));
  } else {
    invocation.out() << RenderDoctor(each);
  }
  return MissingReplicas(each);
}

absl::Status RunHealth(Invocation& invocation) {
  ASSIGN_OR_RETURN(const auto each, invocation.client().Health());
  if (each.size() == 1) RETURN_IF_ERROR(each[0].result.status());
  bool all_serving = true;
  std::vector<JsonObject> entries;
  Table table({"REPLICA", "ADDRESS", "STATUS"});
  for (const auto& entry : each) {
    const std::string status =
        entry.result.ok() ? *entry.result : "UNREACHABLE";
    all_serving &= status == "SERVING";
    JsonObject json;
    json.Str("replica", entry.replica)
        .Str("address", entry.address)
        .Str("status", status);
    if (!entry.result.ok()) {
      json.Object("error", StatusJson(entry.result.status()));
    }
    entries.push_back(std::move(json));
    table.AddRow(
        {entry.replica.empty() ? "-" : entry.replica, entry.address, status});
  }
  const std::string overall = all_serving ? "SERVING" : "NOT_SERVING";
  if (invocation.json()) {
    JsonObject all;
    all.Str("status", overall).Array("replicas", entries);
    PrintJson(invocation.out(), all);
  } else if (each.size() == 1 && each[0].result.ok()) {
    invocation.out() << *each[0].result << "\n";
  } else {
    invocation.out() << table.Render();
  }
  if (all_serving) return absl::OkStatus();
  // A probe script reads the exit status; the lines above say which.
  RETURN_IF_ERROR(MissingReplicas(each));
  return absl::UnavailableError(
      each.size() == 1 ? absl::StrCat("the server is ", *each[0].result)
                       : "not every replica is SERVING");
}

absl::Status RunReplicas(Invocation& invocation) {
  ASSIGN_OR_RETURN(const auto each, invocation.client().Replicas());
  if (each.size() == 1) RETURN_IF_ERROR(each[0].result.status());
  if (invocation.json()) {
    std::vector<JsonObject> entries;
    for (const auto& entry : each) {
      JsonObject json;
      json.Str("address", entry.address);
      if (entry.result.ok()) {
        json.Message("info", *entry.result);
      } else {
        json.Object("error", StatusJson(entry.result.status()));
      }
      entries.push_back(std::move(json));
    }
    JsonObject all;
    all.Array("replicas", entries);
    PrintJson(invocation.out(), all);
    return MissingReplicas(each);
  }
  Table table(
      {"REPLICA", "ADDRESS", "ADVERTISED", "DEVICE", "FREE", "CAPACITY"});
  table.SetAlign(4, Table::Align::kRight);
  table.SetAlign(5, Table::Align::kRight);
  for (const auto& entry : each) {
    if (!entry.result.ok()) {
      table.AddRow({"?", entry.address, "", "", "did not answer"});
      continue;
    }
    const v1::ServerInfo& info = *entry.result;
    bool first = true;
    for (const v1::DeviceRoom& device : info.devices()) {
      table.AddRow(
          {first ? (info.replica().empty() ? "-" : info.replica()) : "",
           first ? entry.address : "", first ? info.advertised_address() : "",
           device.device(), FormatBytes(device.free_bytes()),
           FormatBytes(device.capacity_bytes())});
      first = false;
    }
  }
  invocation.out() << table.Render();
  return MissingReplicas(each);
}

}  // namespace materializer::client::cli
