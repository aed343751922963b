#include "client/routing.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace materializer::client {
namespace {

// Whether `device` ("cuda:1") is what `wanted` asks for: the device itself
// or, for a bare kind ("cuda"), any device of the kind.
bool Matches(const std::string& device, const std::string& wanted) {
  if (device == wanted) return true;
  if (absl::StrContains(wanted, ':')) return false;
  return absl::StartsWith(device, absl::StrCat(wanted, ":"));
}

}  // namespace

std::optional<uint64_t> RoomFor(const v1::ServerInfo& replica,
                                const v1::Placement& placement) {
  const std::string& wanted = placement.device();
  std::optional<uint64_t> room;
  if (wanted == "split") {
    const auto& listed = placement.split().devices();
    for (const v1::DeviceRoom& device : replica.devices()) {
      const bool used =
          listed.empty() || std::find(listed.begin(), listed.end(),
                                      device.device()) != listed.end();
      if (used) room = room.value_or(0) + device.free_bytes();
    }
    return room;
  }
  for (const v1::DeviceRoom& device : replica.devices()) {
    if (wanted.empty() || wanted == "auto" ||
        Matches(device.device(), wanted)) {
      room = std::max(room.value_or(0), device.free_bytes());
    }
  }
  return room;
}

size_t ChooseReplica(const std::vector<v1::ServerInfo>& replicas,
                     const v1::Placement& placement) {
  assert(!replicas.empty());
  size_t best = 0;
  std::optional<uint64_t> best_room;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const std::optional<uint64_t> room = RoomFor(replicas[i], placement);
    if (room.has_value() && (!best_room.has_value() || *room > *best_room)) {
      best = i;
      best_room = room;
    }
  }
  return best;
}

}  // namespace materializer::client
