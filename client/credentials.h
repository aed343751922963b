#ifndef MATERIALIZER_CLIENT_CREDENTIALS_H_
#define MATERIALIZER_CLIENT_CREDENTIALS_H_

// How a client proves who it is and checks who the server is: the three
// identity modes the server offers (docs/operations.md, "Authentication").
//
//   - TLS with a CA (`tls_ca_file`, or the system's roots with `tls`): the
//     server's certificate is checked; the client sends no identity of its
//     own unless it adds one of the next two.
//   - mTLS (`tls_cert_file` + `tls_key_file`): the client's certificate is
//     its identity.
//   - Bearer token (`token`, over TLS only): sent as
//     "authorization: Bearer <token>" on every call.
//   - None of the above: the server's development mode, where the client
//     names itself (ClientOptions::client_name).
//
//   Security security;
//   security.tls_ca_file = "ca.pem";
//   ASSIGN_OR_RETURN(security.token, ReadTokenFile("/run/secrets/token"));
//   ASSIGN_OR_RETURN(auto credentials, MakeChannelCredentials(security));
//
// A token is a secret: nothing here puts it into a status message, a log
// line or Describe(); errors about a token name where it came from.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"

namespace materializer::client {

struct Security {
  // TLS, trusting the system's root certificates unless tls_ca_file is
  // set. Implied by every field below except `token`.
  bool tls = false;
  // PEM bundle of the CA(s) the server's certificate must chain to.
  std::string tls_ca_file;
  // mTLS: the client's certificate chain and private key (PEM), both or
  // neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name checked against the server's certificate instead of the host
  // in the address (e.g. when dialing an IP address).
  std::string tls_server_name;
  // Bearer token. Requires TLS: gRPC never sends call credentials over a
  // plaintext channel, and neither would we.
  std::string token;
  // Where `token` came from ("--token_file=PATH", "MATERIALIZER_TOKEN"),
  // for messages that must not show the token itself.
  std::string token_source;

  bool UsesTls() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() ||
           !tls_key_file.empty() || !tls_server_name.empty();
  }
};

// INVALID_ARGUMENT when the combination cannot work: a token without TLS, a
// certificate without its key (or the reverse), a token that cannot travel
// as an HTTP/2 header value. Messages never contain the token.
absl::Status ValidateSecurity(const Security& security);

// Channel credentials for `security` (validated first): insecure, TLS, TLS
// with a client certificate, each optionally with the bearer token. Reads
// the PEM files now: NOT_FOUND / PERMISSION_DENIED naming an unreadable
// file, INVALID_ARGUMENT for one that holds no PEM block.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const Security& security);

// A token from a file: its content without surrounding whitespace (a
// trailing newline is normal). INVALID_ARGUMENT for an empty file or one
// holding more than one line; errors name the file, never its content.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// One line for --verbose output: the mode and the files, and for a token
// only where it came from and its length.
std::string DescribeSecurity(const Security& security);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_CREDENTIALS_H_
