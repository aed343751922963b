#ifndef MATERIALIZER_SERVER_SERVICE_TLS_FILES_H_
#define MATERIALIZER_SERVER_SERVICE_TLS_FILES_H_

// Checks of TLS files before the server puts them in force, at start-up
// and on every reload: gRPC takes whatever bytes it is given, and a
// certificate it cannot use would fail every new handshake, so a file is
// checked here first and refused (the old one staying in force) when it
// would not work.
//
//   ASSIGN_OR_RETURN(CertificateSummary leaf, CheckKeyPair(chain, key));
//   MLOG(INFO) << "serving " << leaf.subject;
//   ASSIGN_OR_RETURN(int cas, CheckCaBundle(bundle));
//
// Thread-safe (pure functions over OpenSSL).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace materializer::service {

// The leaf of a certificate chain.
struct CertificateSummary {
  // One line, e.g. "CN=server,O=ml".
  std::string subject;
  absl::Time not_after;
  // Certificates in the chain, the leaf included.
  int chain_length = 0;
};

// A certificate chain (PEM, leaf first) and its private key (PEM): every
// certificate parses, there is at least one, the key parses and belongs to
// the leaf, and the leaf has not expired at `now`. INVALID_ARGUMENT saying
// which of these fails otherwise (never quoting the key).
absl::StatusOr<CertificateSummary> CheckKeyPair(
    absl::string_view cert_chain_pem, absl::string_view private_key_pem,
    absl::Time now);

// A bundle of CA certificates (PEM): at least one, and every PEM block a
// certificate that parses. The number of certificates, or
// INVALID_ARGUMENT.
absl::StatusOr<int> CheckCaBundle(absl::string_view pem);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_TLS_FILES_H_
