#ifndef MATERIALIZER_CLIENT_CLI_EXIT_CODE_H_
#define MATERIALIZER_CLIENT_CLI_EXIT_CODE_H_

// matctl's exit statuses: one per outcome a script may want to act on.
// `matctl --help` prints ExitCodeTable(), and docs/api.md ("matctl") lists
// the same rows.

#include <vector>

#include "absl/status/status.h"

namespace materializer::client::cli {

enum ExitCode : int {
  kExitOk = 0,
  // Anything else: the server refused the request as invalid or not
  // possible now, a local file could not be read or written, ...
  kExitFailure = 1,
  // The command line: unknown command or flag, bad value, missing argument,
  // contradicting connection settings.
  kExitUsage = 2,
  // NOT_FOUND: no such handle or export for this identity (or its replica
  // is gone), or no such local file.
  kExitNotFound = 3,
  // UNAUTHENTICATED, PERMISSION_DENIED (a local file too), and TLS
  // handshakes that fail over a certificate (the server's or the client's).
  kExitDenied = 4,
  // RESOURCE_EXHAUSTED: no device has the room, or a quota is reached.
  kExitExhausted = 5,
  // UNAVAILABLE, DEADLINE_EXCEEDED: the server (or a replica) did not
  // answer, or is not SERVING.
  kExitUnavailable = 6,
  // DATA_LOSS: a fetched file failed its digest or framing checks.
  kExitDataLoss = 7,
};

struct ExitCodeRow {
  ExitCode code;
  const char* meaning;
};

const std::vector<ExitCodeRow>& ExitCodeTable();

// The exit status for a failed command's status; `tls` says whether the
// client used TLS (see IsCertificateFailure).
ExitCode ExitCodeFor(const absl::Status& status, bool tls);

// True for an UNAVAILABLE that is a TLS handshake that failed over a
// certificate, which gRPC reports as UNAVAILABLE: the client rejecting
// the server's certificate (gRPC names the reason), or, over TLS, the
// server closing a new connection during the handshake, which is how a
// missing or refused client certificate looks from the client (TLS 1.3
// sends the server's verdict after the client thinks it is done).
bool IsCertificateFailure(const absl::Status& status, bool tls);

}  // namespace materializer::client::cli

#endif  // MATERIALIZER_CLIENT_CLI_EXIT_CODE_H_
