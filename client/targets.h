#ifndef MATERIALIZER_CLIENT_TARGETS_H_
#define MATERIALIZER_CLIENT_TARGETS_H_

// What a client's target names: one server, or the addresses of several
// replicas.
//
//   "127.0.0.1:50051"                       one server
//   "materializer.ml.svc.cluster.local:50051"
//                                           a headless Service: one address
//                                           per ready pod
//   "127.0.0.1:7001,127.0.0.1:7002"         replicas listed by hand (tests)
//   "unix:/run/materializer.sock", "dns:///host:50051"
//                                           gRPC targets with a scheme: one
//                                           entry, passed to gRPC as is
//
//   ASSIGN_OR_RETURN(Resolved resolved, ResolveTarget(options.target));
//   for (const Endpoint& endpoint : resolved.endpoints) ...

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace materializer::client {

// An address to dial, and the name to check the server's TLS certificate
// against when it is not the address's host (an IP found by looking up
// `tls_name`).
struct Endpoint {
  std::string address;
  std::string tls_name;

  bool operator==(const Endpoint& other) const {
    return address == other.address && tls_name == other.tls_name;
  }
};

// The entries of a target: the comma-separated "host:port" items (IPv6 as
// "[::1]:50051"), or the whole target when it has a gRPC scheme.
// INVALID_ARGUMENT for an empty target, an empty item or one without a
// port.
absl::StatusOr<std::vector<std::string>> SplitTarget(absl::string_view target);

struct Resolved {
  // Distinct endpoints in target order.
  std::vector<Endpoint> endpoints;
  // Items whose host name did not resolve (UNAVAILABLE naming it).
  std::vector<absl::Status> failures;
};

// Looks up every host name of the target: each of its addresses becomes an
// endpoint with the name as tls_name. A name with both IPv4 and IPv6
// addresses gives its IPv4 ones only, so "localhost" is one server (a
// server that listens on 127.0.0.1 does not answer on ::1), while a
// Service name gives one address per pod. IP addresses and targets with a
// scheme are endpoints as they are. Errors: those of SplitTarget.
absl::StatusOr<Resolved> ResolveTarget(absl::string_view target);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_TARGETS_H_
