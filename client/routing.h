#ifndef MATERIALIZER_CLIENT_ROUTING_H_
#define MATERIALIZER_CLIENT_ROUTING_H_

// Where a call goes when a client talks to several replicas (the rules are
// in docs/api.md, "Several replicas"; the Python client follows them too).
//
//   - A call that names a handle or an export goes to the replica its id
//     names (registry::ReplicaOfId).
//   - Materialize and Plan go to the replica with the most room for the
//     request's placement (RoomFor), ties to the first in name order.
//
//   std::vector<v1::ServerInfo> infos = ...;  // GetServerInfo of each
//   size_t best = ChooseReplica(infos, request.placement());

#include <cstdint>
#include <optional>
#include <vector>

#include "materializer/v1/materializer.pb.h"

namespace materializer::client {

// The free bytes a placement could use on one replica, or nullopt when the
// replica has no device the placement can use:
//   - "" or "auto": the largest free device (a handle lands on one);
//   - a device kind ("cpu", "cuda"): the largest free device of that kind
//     ("cpu", "cpu:N"; "cuda:N");
//   - a device ("cuda:1"): that device's free bytes;
//   - "split": the sum over split.devices (every device when empty), since
//     a split handle spreads over them.
std::optional<uint64_t> RoomFor(const v1::ServerInfo& replica,
                                const v1::Placement& placement);

// The index of the replica with the most room for `placement` (ties: the
// lowest index). When no replica has a usable device, 0: that replica's
// answer then says why the placement cannot be served.
// REQUIRES: !replicas.empty().
size_t ChooseReplica(const std::vector<v1::ServerInfo>& replicas,
                     const v1::Placement& placement);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_ROUTING_H_
