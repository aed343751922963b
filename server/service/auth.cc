#include "server/service/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/common/status_macros.h"
#include "server/service/published_file.h"
#include "server/service/tls_files.h"

namespace materializer::service {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", what, " ", path));
  }
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The one "authorization" value of a call, or UNAUTHENTICATED.
template <typename Metadata>
absl::StatusOr<absl::string_view> AuthorizationOf(const Metadata& metadata) {
  auto [begin, end] = metadata.equal_range(kAuthorizationMetadataKey);
  if (begin == end) {
    return absl::UnauthenticatedError(
        "missing bearer token: send metadata \"authorization: Bearer "
        "<token>\"");
  }
  if (std::next(begin) != end) {
    return absl::UnauthenticatedError(
        "more than one authorization metadata value; send one bearer token");
  }
  return absl::string_view(begin->second.data(), begin->second.size());
}

// gRPC's certificate provider looks at its files this often (whole
// seconds; 1 is the least), so a checked new certificate is used within
// about a second of being published.
constexpr unsigned int kProviderRefreshSeconds = 1;

}  // namespace

// The token table in force. Thread-safe: readers take a reference to the
// current table, so a swap never disturbs a lookup under way.
class TokenStore {
 public:
  std::shared_ptr<const TokenTable> Get() const {
    absl::MutexLock lock(&mu_);
    return table_;
  }
  void Set(std::shared_ptr<const TokenTable> table) {
    absl::MutexLock lock(&mu_);
    table_ = std::move(table);
  }

 private:
  mutable absl::Mutex mu_;
  // Guards the pointer (the table itself is immutable).
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
};

namespace {

// Refuses a call without a valid bearer token before any handler runs.
// It changes nothing: `context` is the connection's auth context, shared by
// every call on it, so the caller's identity is not recorded there but
// taken by Authenticator::Authenticate from each call's own metadata.
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::shared_ptr<const TokenStore> tokens)
      : tokens_(std::move(tokens)) {}

  // A hash and a table scan: cheap enough for gRPC's own threads.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata,
                       grpc::AuthContext* /*context*/,
                       OutputMetadata* /*consumed_metadata*/,
                       OutputMetadata* /*response_metadata*/) override {
    absl::StatusOr<absl::string_view> authorization = AuthorizationOf(metadata);
    absl::Status status = authorization.status();
    if (status.ok()) {
      status = tokens_->Get()->ClientOf(*authorization).status();
    }
    if (!status.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(status.message()));
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<const TokenStore> tokens_;
};

}  // namespace

TokenTable::TokenTable(
    const absl::flat_hash_map<std::string, std::string>& tokens) {
  entries_.reserve(tokens.size());
  for (const auto& [token, client] : tokens) {
    Entry entry;
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
           entry.digest);
    entry.client = client;
    entries_.push_back(std::move(entry));
  }
}

absl::StatusOr<std::string> TokenTable::ClientOf(
    absl::string_view authorization) const {
  if (!absl::ConsumePrefix(&authorization, "Bearer ")) {
    return absl::UnauthenticatedError(
        "authorization metadata is not \"Bearer <token>\"");
  }
  unsigned char digest[32];
  SHA256(reinterpret_cast<const unsigned char*>(authorization.data()),
         authorization.size(), digest);
  // Every entry is compared, whichever matches.
  const std::string* client = nullptr;
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest, digest, sizeof(digest)) == 0) {
      client = &entry.client;
    }
  }
  if (client == nullptr) {
    return absl::UnauthenticatedError("bearer token not recognised");
  }
  return *client;
}

std::string ClientNameProblem(absl::string_view name) {
  if (name.empty() || name.size() > 128) {
    return absl::StrCat("client name must be 1..128 characters, got ",
                        name.size());
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        absl::string_view("._@:+-").find(c) == absl::string_view::npos) {
      return absl::StrCat("client name has a character outside "
                          "[A-Za-z0-9._@:+-]: '",
                          absl::CHexEscape(absl::string_view(&c, 1)), "'");
    }
  }
  return "";
}

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseTokenFile(
    absl::string_view text) {
  absl::flat_hash_map<std::string, std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file line ", line_number,
          ": expected \"<token> <client name>\""));
    }
    if (fields[0].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file line ", line_number,
          ": tokens must be at least 16 characters"));
    }
    if (std::string problem = ClientNameProblem(fields[1]); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file line ", line_number, ": ", problem));
    }
    if (!tokens.emplace(std::string(fields[0]), std::string(fields[1]))
             .second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file line ", line_number, ": the token repeats an earlier "
                                           "line"));
    }
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError("token file has no tokens");
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    const AuthOptions& options) {
  std::unique_ptr<Authenticator> auth(new Authenticator());
  auth->options_ = options;
  auth->admins_.insert(options.admin_clients.begin(),
                       options.admin_clients.end());
  const bool tls =
      !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (!tls) {
    if (!options.client_ca_file.empty() || !options.token_file.empty()) {
      return absl::InvalidArgumentError(
          "client certificates and bearer tokens need TLS: give the server "
          "certificate and key too (--tls_cert, --tls_key)");
    }
    auth->credentials_ = grpc::InsecureServerCredentials();
    return auth;
  }
  RETURN_IF_ERROR(auth->SetUpTls(options));
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFile(options.token_file, "token file"));
    auth->tokens_ = std::make_shared<TokenStore>();
    RETURN_IF_ERROR(auth->ReplaceTokens(text).status());
    auth->credentials_->SetAuthMetadataProcessor(
        std::make_shared<TokenProcessor>(auth->tokens_));
    auth->loaded_.push_back({"tokens", {options.token_file}, {text}, {}});
  }
  if (!auth->mtls_ && auth->tokens_ == nullptr) {
    return absl::InvalidArgumentError(
        "TLS without client authentication would leave callers anonymous: "
        "add --tls_client_ca (mTLS) or --token_file (bearer tokens)");
  }
  auth->insecure_ = false;
  return auth;
}

absl::Status Authenticator::SetUpTls(const AuthOptions& options) {
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both the certificate (--tls_cert) and key (--tls_key)");
  }
  ASSIGN_OR_RETURN(std::string cert,
                   ReadFile(options.tls_cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(std::string key, ReadFile(options.tls_key_file, "TLS key"));
  ASSIGN_OR_RETURN(identity_file_, PublishedFile::Create("tls-identity", ""));
  RETURN_IF_ERROR(ReplaceIdentity(cert, key).status());
  loaded_.push_back({"certificate",
                     {options.tls_cert_file, options.tls_key_file},
                     {std::move(cert), std::move(key)},
                     {}});
  std::string client_ca_path;
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(std::string bundle,
                     ReadFile(options.client_ca_file, "client CA"));
    ASSIGN_OR_RETURN(client_ca_file_,
                     PublishedFile::Create("tls-client-ca", ""));
    RETURN_IF_ERROR(ReplaceClientCa(bundle).status());
    loaded_.push_back(
        {"client_ca", {options.client_ca_file}, {std::move(bundle)}, {}});
    client_ca_path = client_ca_file_->path();
    mtls_ = true;
  }
  // The provider reads the key and the chain from one file (each is taken
  // from its own PEM blocks), so they always change together.
  provider_ =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          identity_file_->path(), identity_file_->path(), client_ca_path,
          kProviderRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider_);
  tls.watch_identity_key_cert_pairs();
  if (mtls_) {
    tls.watch_root_certs();
    tls.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  credentials_ = grpc::experimental::TlsServerCredentials(tls);
  if (credentials_ == nullptr) {
    return absl::InternalError("gRPC refused the TLS server credentials");
  }
  return absl::OkStatus();
}

Authenticator::~Authenticator() = default;

absl::StatusOr<std::string> Authenticator::ReplaceTokens(
    absl::string_view text) {
  absl::StatusOr<absl::flat_hash_map<std::string, std::string>> tokens =
      ParseTokenFile(text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.token_file, ": ", tokens.status().message()));
  }
  absl::flat_hash_set<absl::string_view> clients;
  for (const auto& [token, client] : *tokens) clients.insert(client);
  const std::string summary = absl::StrCat(
      tokens->size(), tokens->size() == 1 ? " token" : " tokens", " for ",
      clients.size(), clients.size() == 1 ? " client" : " clients");
  tokens_->Set(std::make_shared<const TokenTable>(*tokens));
  return summary;
}

absl::StatusOr<std::string> Authenticator::ReplaceIdentity(
    absl::string_view cert_chain, absl::string_view key) {
  absl::StatusOr<CertificateSummary> leaf =
      CheckKeyPair(cert_chain, key, absl::Now());
  if (!leaf.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.tls_cert_file, " and ", options_.tls_key_file,
                     ": ", leaf.status().message()));
  }
  RETURN_IF_ERROR(identity_file_->Replace(absl::StrCat(key, "\n", cert_chain)));
  return absl::StrCat(
      leaf->subject, ", valid until ",
      absl::FormatTime(absl::RFC3339_sec, leaf->not_after, absl::UTCTimeZone()),
      ", chain of ", leaf->chain_length);
}

absl::StatusOr<std::string> Authenticator::ReplaceClientCa(
    absl::string_view bundle) {
  absl::StatusOr<int> count = CheckCaBundle(bundle);
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.client_ca_file, ": ", count.status().message()));
  }
  RETURN_IF_ERROR(client_ca_file_->Replace(bundle));
  return absl::StrCat(*count,
                      *count == 1 ? " CA certificate" : " CA certificates");
}

std::vector<CredentialSource> Authenticator::CredentialSources() {
  std::vector<CredentialSource> sources = loaded_;
  for (CredentialSource& source : sources) {
    if (source.kind == "tokens") {
      source.apply = [this](const std::vector<std::string>& contents) {
        return ReplaceTokens(contents[0]);
      };
    } else if (source.kind == "certificate") {
      source.apply = [this](const std::vector<std::string>& contents) {
        return ReplaceIdentity(contents[0], contents[1]);
      };
    } else {
      source.apply = [this](const std::vector<std::string>& contents) {
        return ReplaceClientCa(contents[0]);
      };
    }
  }
  return sources;
}

std::shared_ptr<grpc::ServerCredentials> Authenticator::ServerCredentials()
    const {
  return credentials_;
}

std::string Authenticator::Describe() const {
  if (insecure_) {
    return absl::StrCat("INSECURE development mode: client identity is "
                        "taken from the '",
                        kClientMetadataKey,
                        "' call metadata without authentication");
  }
  const bool tokens = tokens_ != nullptr;
  return absl::StrCat("TLS with ", mtls_ && tokens
                                       ? "client certificates and bearer tokens"
                                   : mtls_ ? "client certificates (mTLS)"
                                           : "bearer tokens");
}

absl::StatusOr<engine::Caller> Authenticator::Authenticate(
    const grpc::CallbackServerContext& context) const {
  engine::Caller caller;
  const auto& metadata = context.client_metadata();
  if (insecure_) {
    auto it = metadata.find(kClientMetadataKey);
    caller.identity = kAnonymous;
    if (it != metadata.end()) {
      const absl::string_view name(it->second.data(), it->second.size());
      if (std::string problem = ClientNameProblem(name); !problem.empty()) {
        return absl::UnauthenticatedError(
            absl::StrCat("metadata ", kClientMetadataKey, ": ", problem));
      }
      caller.identity = std::string(name);
    }
  } else if (tokens_ != nullptr) {
    // This call's own token (the processor has already checked that it
    // has one); it wins over a client certificate.
    absl::StatusOr<absl::string_view> authorization = AuthorizationOf(metadata);
    if (!authorization.ok()) return authorization.status();
    absl::StatusOr<std::string> client =
        tokens_->Get()->ClientOf(*authorization);
    if (!client.ok()) return client.status();
    caller.identity = std::move(*client);
  } else {
    // The connection's verified certificate: its first SAN, else its CN.
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    std::vector<grpc::string_ref> identity;
    if (auth != nullptr) {
      identity = auth->FindPropertyValues("x509_subject_alternative_name");
      if (identity.empty()) {
        identity = auth->FindPropertyValues("x509_common_name");
      }
    }
    if (identity.empty()) {
      return absl::UnauthenticatedError(
          "the call carries no client identity (no verified client "
          "certificate)");
    }
    caller.identity = std::string(identity.front().data(),
                                  identity.front().size());
  }
  if (auto it = metadata.find(kSessionMetadataKey); it != metadata.end()) {
    caller.session = std::string(it->second.data(), it->second.size());
  }
  caller.admin = admins_.contains(caller.identity);
  return caller;
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::string_view host = address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == absl::string_view::npos
                              ? host.size() - 1
                              : host.find(']') - 1);
  } else if (size_t colon = host.rfind(':');
             colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" ||
         absl::StartsWith(host, "127.");
}

}  // namespace materializer::service
