#ifndef MATERIALIZER_CLIENT_CLI_HINTS_H_
#define MATERIALIZER_CLIENT_CLI_HINTS_H_

// A line of advice under an error, for the failures people meet first: no
// server at the address, TLS on one side only, an untrusted or refused
// certificate, a missing or refused token.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"

namespace materializer::client::cli {

// The hint for `status` from a client connected with `options`, or "".
std::string HintFor(const absl::Status& status, const ClientOptions& options);

// `status` (the failure of a command that asked every replica) marked with
// the replicas that did not answer (`silent`, as ReplicaLabel names them)
// while others did, so that HintFor names those rather than saying that no
// server answered. `status` unchanged when `silent` is empty.
absl::Status WithSilentReplicas(absl::Status status,
                                const std::vector<std::string>& silent);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_HINTS_H_
