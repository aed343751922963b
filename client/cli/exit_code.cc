#include "client/cli/exit_code.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace materializer::client::cli {

const std::vector<ExitCodeRow>& ExitCodeTable() {
  static const auto* table = new std::vector<ExitCodeRow>{
      {kExitOk, "success"},
      {kExitFailure,
       "any other failure: an invalid request, a failed precondition, a file "
       "that cannot be read or written"},
      {kExitUsage,
       "usage: unknown command or flag, bad value, missing argument, "
       "contradicting or unreadable connection settings"},
      {kExitNotFound,
       "not found: no such handle or export for you (or its replica is "
       "gone), or no such local file"},
      {kExitDenied,
       "permission or authentication: no or a refused identity (token, "
       "client certificate), an untrusted server certificate, or a local "
       "file matctl may not read or write"},
      {kExitExhausted,
       "resource exhausted: no device has the room, or a quota is reached"},
      {kExitUnavailable,
       "unavailable: the server or a replica did not answer in time, or is "
       "not SERVING"},
      {kExitDataLoss,
       "data loss: a fetched file failed its digest or framing checks"},
  };
  return *table;
}

bool IsCertificateFailure(const absl::Status& status, bool tls) {
  if (status.code() != absl::StatusCode::kUnavailable) return false;
  const std::string message = absl::AsciiStrToLower(status.message());
  // gRPC's words when the client rejects the server's certificate, or an
  // alert from the server names the client's.
  for (const char* mark :
       {"certificate verify failed", "certificate_verify_failed",
        "certificate required", "certificate_required", "bad certificate",
        "bad_certificate", "unknown ca", "unknown_ca", "certificate expired",
        "certificate_expired"}) {
    if (absl::StrContains(message, mark)) return true;
  }
  return tls && absl::StrContains(message, "failed to connect") &&
         absl::StrContains(message, "socket closed");
}

ExitCode ExitCodeFor(const absl::Status& status, bool tls) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitDenied;
    case absl::StatusCode::kResourceExhausted:
      return kExitExhausted;
    case absl::StatusCode::kUnavailable:
      return IsCertificateFailure(status, tls) ? kExitDenied : kExitUnavailable;
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnavailable;
    case absl::StatusCode::kDataLoss:
      return kExitDataLoss;
    default:
      return kExitFailure;
  }
}

}  // namespace materializer::client::cli
