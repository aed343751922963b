#ifndef MATERIALIZER_SERVER_SERVICE_AUTH_H_
#define MATERIALIZER_SERVER_SERVICE_AUTH_H_

// Who is calling. Identity comes from the transport's authentication,
// never from a request field:
//
//   - bearer token (TLS): the "authorization: Bearer <token>" metadata is
//     checked against a token file by an AuthMetadataProcessor before any
//     handler runs (a call without a valid token gets nothing done), and
//     each call's identity is the client its own token names. Nothing is
//     stored on the connection: gRPC shares one auth context between all
//     the calls of a connection, so a token is a fact about its call only.
//   - mTLS: the client certificate, verified against the client CA; the
//     identity is its first subject alternative name, else its common name.
//   - development mode (no TLS): the client names itself in the
//     "x-materializer-client" metadata. Loopback only unless explicitly
//     allowed, and logged as insecure.
//
// The token file, the certificate with its key and the client CA can be
// replaced while the server runs (CredentialSources(), driven by a
// CredentialWatcher): new contents are checked first and refused, the old
// ones staying, when they would not work. A new token table applies from
// the next call on; a new certificate or client CA from the next TLS
// handshake (connections already open keep theirs). The TLS material goes
// to gRPC through its file-watching certificate provider, which reads it
// from in-memory files (published_file.h) that hold only checked
// contents.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Authenticator> auth,
//                    Authenticator::Create(options));
//   builder.AddListeningPort(address, auth->ServerCredentials());
//   CredentialWatcher watcher(auth->CredentialSources(), interval, metrics);
//   ASSIGN_OR_RETURN(engine::Caller caller, auth->Authenticate(context));

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "server/engine/engine.h"
#include "server/service/credential_watcher.h"

namespace grpc::experimental {
class CertificateProviderInterface;
}  // namespace grpc::experimental

namespace materializer::service {

class PublishedFile;
class TokenStore;

inline constexpr char kClientMetadataKey[] = "x-materializer-client";
inline constexpr char kSessionMetadataKey[] = "x-materializer-session";
inline constexpr char kAnonymous[] = "anonymous";
inline constexpr char kAuthorizationMetadataKey[] = "authorization";

struct AuthOptions {
  // TLS: server certificate chain and key (PEM files). Without them the
  // server runs the development mode.
  std::string tls_cert_file;
  std::string tls_key_file;
  // mTLS: CA bundle that client certificates must chain to. Requires TLS;
  // clients without a valid certificate fail the handshake.
  std::string client_ca_file;
  // Bearer tokens: lines "<token> <client name>" ('#' starts a comment).
  // Requires TLS (tokens never cross the network in plaintext).
  std::string token_file;
  // Identities that may see every client's stats.
  std::vector<std::string> admin_clients;
};

// Bearer tokens and the clients they name. Lookups compare SHA-256 digests
// of the presented token with every known token's in constant time, so
// timing says nothing about how much of a guess was right (nor its
// length). Thread-safe; immutable.
class TokenTable {
 public:
  explicit TokenTable(
      const absl::flat_hash_map<std::string, std::string>& tokens);

  // The client an "authorization" metadata value ("Bearer <token>") names;
  // UNAUTHENTICATED saying what is wrong otherwise. Never echoes the value.
  absl::StatusOr<std::string> ClientOf(absl::string_view authorization) const;

 private:
  struct Entry {
    unsigned char digest[32];
    std::string client;
  };
  std::vector<Entry> entries_;
};

// Thread-safe: calls are authenticated while CredentialSources()'
// callbacks replace the credentials.
class Authenticator {
 public:
  // Reads and checks every file `options` names. INVALID_ARGUMENT naming
  // the file and the problem.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      const AuthOptions& options);
  ~Authenticator();
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // The credentials to listen with (TLS, with the token processor
  // attached, or insecure for the development mode).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  // True for the development mode (identity from metadata).
  bool insecure() const { return insecure_; }

  // A one-line description for the startup log.
  std::string Describe() const;

  // The caller of this call, from this call's own credentials: its bearer
  // token, else the connection's verified client certificate (which is the
  // same for every call of a connection by nature), else (development mode)
  // its metadata. UNAUTHENTICATED if none identifies it or the claimed
  // development-mode name is malformed. Cheap (a hash and a table scan):
  // runs on gRPC's callback thread, before the call is queued.
  absl::StatusOr<engine::Caller> Authenticate(
      const grpc::CallbackServerContext& context) const;

  // The credential files that can be replaced while the server runs, each
  // with the contents in force and the callback that checks and swaps in
  // new ones: "tokens" (the token file), "certificate" (certificate chain
  // and key, together), "client_ca". None in the development mode. The
  // callbacks use this object, which must outlive their caller.
  std::vector<CredentialSource> CredentialSources();

 private:
  Authenticator() = default;

  // Reads and checks the TLS files, and sets up the credentials.
  absl::Status SetUpTls(const AuthOptions& options);
  // The CredentialSource callbacks.
  absl::StatusOr<std::string> ReplaceTokens(absl::string_view text);
  absl::StatusOr<std::string> ReplaceIdentity(absl::string_view cert_chain,
                                              absl::string_view key);
  absl::StatusOr<std::string> ReplaceClientCa(absl::string_view bundle);

  AuthOptions options_;
  bool insecure_ = true;
  bool mtls_ = false;
  // Set when bearer tokens are configured; shared with the token processor.
  std::shared_ptr<TokenStore> tokens_;
  // TLS: the checked key and certificate chain (one file), and client CA,
  // that gRPC's certificate provider reads. Declared before the provider
  // and the credentials, so that those are gone before these close.
  std::unique_ptr<PublishedFile> identity_file_;
  std::unique_ptr<PublishedFile> client_ca_file_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  absl::flat_hash_set<std::string> admins_;
  // What was loaded at Create, for CredentialSources().
  std::vector<CredentialSource> loaded_;
};

// Parses a token file ("<token> <client name>" per line). INVALID_ARGUMENT
// naming the line for malformed lines, bad names or repeated tokens.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseTokenFile(
    absl::string_view text);

// The reason `name` is not an acceptable client name, or "".
std::string ClientNameProblem(absl::string_view name);

// True for 127.0.0.0/8, ::1 and "localhost" (with any port).
bool IsLoopbackAddress(absl::string_view address);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_AUTH_H_
