#ifndef MATERIALIZER_SERVER_SERVICE_SERVER_INFO_H_
#define MATERIALIZER_SERVER_SERVICE_SERVER_INFO_H_

// Who this server is among several replicas, and how much room it has:
// the answer to GetServerInfo, which clients use to route calls
// (docs/architecture.md, "Scale-out").
//
//   ASSIGN_OR_RETURN(std::string replica,
//                    ReplicaNameFor(flag_replica, flag_advertise, hostname));
//   v1::ServerInfo info = ServerInfoFromStats(replica, advertise, stats);

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::service {

// The replica name the server's handle ids carry:
//   - `replica` when given (INVALID_ARGUMENT unless it is a DNS label);
//   - else, with `advertise` ("host:port") given, the first label of its
//     host ("materializer-1" from "materializer-1.materializer.ml.svc...:
//     50051"), or of `hostname` when the host is an IP address;
//   - else "": a single server, whose ids name no replica.
// Names are lowercased. INVALID_ARGUMENT for an `advertise` that is not
// host:port, or a derived name that is not a DNS label (say which flag to
// set instead).
absl::StatusOr<std::string> ReplicaNameFor(absl::string_view replica,
                                           absl::string_view advertise,
                                           absl::string_view hostname);

// GetServerInfo's answer from the server's identity and its current
// GetStats (devices, capacity, reserved and in-use bytes).
v1::ServerInfo ServerInfoFromStats(absl::string_view replica,
                                   absl::string_view advertised_address,
                                   const v1::GetStatsResponse& stats);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_SERVER_INFO_H_
