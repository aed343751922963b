#include "client/cli/hints.h"

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/optional.h"
#include "client/cli/exit_code.h"

namespace materializer::client::cli {
namespace {

// The payload WithSilentReplicas adds: the labels, one per line.
constexpr char kSilentReplicasPayload[] =
    "type.materializer.dev/matctl.SilentReplicas";

bool Contains(const std::string& haystack,
              std::initializer_list<const char*> needles) {
  for (const char* needle : needles) {
    if (absl::StrContains(haystack, needle)) return true;
  }
  return false;
}

}  // namespace

absl::Status WithSilentReplicas(absl::Status status,
                                const std::vector<std::string>& silent) {
  if (!silent.empty() && !status.ok()) {
    status.SetPayload(kSilentReplicasPayload,
                      absl::Cord(absl::StrJoin(silent, "\n")));
  }
  return status;
}

std::string HintFor(const absl::Status& status, const ClientOptions& options) {
  const std::string message = absl::AsciiStrToLower(status.message());
  const Security& security = options.security;
  const absl::optional<absl::Cord> silent =
      status.GetPayload(kSilentReplicasPayload);
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
      if (!security.token.empty()) {
        return absl::StrCat("the server did not accept the token from ",
                            security.token_source,
                            "; check that it is listed in the server's "
                            "--token_file");
      }
      if (!security.tls_cert_file.empty()) {
        // The handshake took the certificate: the server wants a token on
        // every call as well (it has a --token_file).
        return "the server took the client certificate but wants a bearer "
               "token on every call too: give --token_file, "
               "MATERIALIZER_TOKEN_FILE or MATERIALIZER_TOKEN";
      }
      return "the server wants an identity: a bearer token (--token_file, "
             "MATERIALIZER_TOKEN_FILE or MATERIALIZER_TOKEN) or a client "
             "certificate (--tls_cert and --tls_key)";
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      if (silent.has_value()) {
        const std::vector<std::string> labels =
            absl::StrSplit(std::string(*silent), '\n');
        return absl::StrCat(
            absl::StrJoin(labels, ", "),
            " did not answer, while the other replicas did (their answers "
            "are above): is materializerd running there? A replica that "
            "restarted has lost its handles; `matctl replicas` shows which "
            "replicas answer");
      }
      if (status.code() == absl::StatusCode::kDeadlineExceeded) return "";
      break;
    default:
      return "";
  }
  if (IsCertificateFailure(status, security.UsesTls())) {
    if (Contains(message,
                 {"certificate_verify_failed", "certificate verify failed"})) {
      return absl::StrCat(
          "the server's certificate was not trusted: it must chain to ",
          security.tls_ca_file.empty() ? std::string("the system's roots")
                                       : security.tls_ca_file,
          " (--tls_ca) and name the host in --server (or --tls_server_name)");
    }
    return security.tls_cert_file.empty()
               ? "the server closed the connection during the TLS handshake: "
                 "it probably requires a client certificate (mTLS): give "
                 "--tls_cert and --tls_key"
               : absl::StrCat(
                     "the server closed the connection during the "
                     "TLS handshake: it probably refused the client "
                     "certificate ",
                     security.tls_cert_file,
                     ", which must chain to the server's client CA "
                     "and be valid now");
  }
  if (security.UsesTls() &&
      Contains(message, {"wrong_version_number", "wrong version number",
                         "ssl handshake failed", "packet_length_too_long",
                         "http_request"})) {
    return "the server does not seem to speak TLS (a development-mode "
           "server?): leave out --tls, --tls_ca, --tls_cert and --tls_key";
  }
  if (!security.UsesTls() &&
      Contains(message,
               {"socket closed", "connection reset", "end of tcp stream",
                "frame of size", "frame_size_error", "tls", "ssl"})) {
    return "the server closed the connection: if it uses TLS, give --tls_ca "
           "(or --tls) and an identity";
  }
  if (Contains(message, {"held by replica ", "replica "}) &&
      Contains(message, {"did not answer"}) &&
      !Contains(message, {"no replica at"})) {
    // One replica of several: the others are fine.
    return "one replica is not answering; calls for its handles fail until "
           "it is back (and its handles are gone if it restarted), while the "
           "other replicas keep serving: `matctl replicas` shows which "
           "answer";
  }
  if (Contains(message,
               {"connection refused", "failed to connect", "cannot look up",
                "dns resolution failed", "name resolution", "no route to host",
                "did not answer", "deadline exceeded"})) {
    return absl::StrCat(
        "no server answered at ", options.target,
        ". Is materializerd running there? `./dev serve` starts one on "
        "127.0.0.1:50051; --server (or MATERIALIZER_SERVER) points matctl "
        "elsewhere");
  }
  return "";
}

}  // namespace materializer::client::cli
