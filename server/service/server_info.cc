#include "server/service/server_info.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/registry/handle_id.h"

namespace materializer::service {
namespace {

// "10.0.0.7", "[::1]": an IP literal has no name to take a label from.
bool IsIpLiteral(absl::string_view host) {
  if (!host.empty() && host.front() == '[') return true;
  for (const char c : host) {
    if (!absl::ascii_isdigit(c) && c != '.') return false;
  }
  return true;
}

absl::string_view FirstLabel(absl::string_view name) {
  return name.substr(0, name.find('.'));
}

}  // namespace

absl::StatusOr<std::string> ReplicaNameFor(absl::string_view replica,
                                           absl::string_view advertise,
                                           absl::string_view hostname) {
  if (!replica.empty()) {
    if (std::string problem = registry::ReplicaNameProblem(replica);
        !problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--replica: ", problem));
    }
    return std::string(replica);
  }
  if (advertise.empty()) return std::string();
  const size_t colon = advertise.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(advertise.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise=", advertise,
        " must be host:port, the address clients reach this replica at "
        "(e.g. materializer-0.materializer.ml.svc.cluster.local:50051)"));
  }
  const absl::string_view host = advertise.substr(0, colon);
  const bool from_hostname = IsIpLiteral(host);
  const std::string name =
      absl::AsciiStrToLower(FirstLabel(from_hostname ? hostname : host));
  if (std::string problem = registry::ReplicaNameProblem(name);
      !problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot name this replica after ",
                     from_hostname ? "the host name" : "the --advertise host",
                     ": ", problem, "; set --replica"));
  }
  return name;
}

v1::ServerInfo ServerInfoFromStats(absl::string_view replica,
                                   absl::string_view advertised_address,
                                   const v1::GetStatsResponse& stats) {
  v1::ServerInfo info;
  info.set_replica(std::string(replica));
  info.set_advertised_address(std::string(advertised_address));
  for (const v1::DeviceStats& device : stats.devices()) {
    v1::DeviceRoom* room = info.add_devices();
    room->set_device(device.device());
    room->set_capacity_bytes(device.capacity_bytes());
    const uint64_t held = device.reserved_bytes() + device.in_use_bytes() +
                          device.handed_over_bytes();
    // A released handle's bytes still held by a fetch in flight can push
    // held above capacity for a moment.
    room->set_free_bytes(
        held >= device.capacity_bytes() ? 0 : device.capacity_bytes() - held);
  }
  return info;
}

}  // namespace materializer::service
