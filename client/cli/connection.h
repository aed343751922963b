#ifndef MATERIALIZER_CLIENT_CLI_CONNECTION_H_
#define MATERIALIZER_CLIENT_CLI_CONNECTION_H_

// How matctl connects: ClientOptions from the connection flags and their
// environment variables (flag_table.cc lists them), and the bearer token,
// which has no flag so that it never shows in a process listing:
//
//   --token_file=PATH             a file holding the token (wins over both
//   MATERIALIZER_TOKEN_FILE=PATH  variables; the variables conflict)
//   MATERIALIZER_TOKEN=TOKEN      the token itself
//
// Nothing here prints or returns the token in a message.

#include <string>

#include "absl/status/statusor.h"
#include "client/cli/flags.h"
#include "client/client.h"

namespace materializer::client::cli {

inline constexpr char kTokenVariable[] = "MATERIALIZER_TOKEN";
inline constexpr char kTokenFileVariable[] = "MATERIALIZER_TOKEN_FILE";

// The client options for `flags` (already parsed, environment included)
// and the token variables in `env`. INVALID_ARGUMENT for contradicting
// settings (both token variables; a token without TLS; a certificate
// without its key); the token file's errors (NOT_FOUND, ...).
absl::StatusOr<ClientOptions> ConnectionOptions(const FlagValues& flags,
                                                const Environment& env);

// What --verbose prints about the connection: the target and where it came
// from, the identity mode, the token's source and length (never the
// token).
std::string DescribeConnection(const ClientOptions& options,
                               const FlagValues& flags);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_CONNECTION_H_
