#ifndef MATERIALIZER_CLIENT_CLI_HINTS_H_
#define MATERIALIZER_CLIENT_CLI_HINTS_H_

// A line of advice under an error, for the failures people meet first: no
// server at the address, TLS on one side only, an untrusted or refused
// certificate, a missing or refused token.

#include <string>

#include "absl/status/status.h"
#include "client/client.h"

namespace materializer::client::cli {

// The hint for `status` from a client connected with `options`, or "".
std::string HintFor(const absl::Status& status, const ClientOptions& options);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_HINTS_H_
