#include "server/service/auth.h"

#include <openssl/crypto.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "server/common/status_macros.h"

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

// Checks "authorization: Bearer <token>" before any handler runs and makes
// the token's client the call's peer identity.
class TokenProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(absl::flat_hash_map<std::string, std::string> tokens)
      : tokens_(std::move(tokens)) {}

  // A map lookup: cheap enough for gRPC's own threads.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata,
                       grpc::AuthContext* context,
                       OutputMetadata* consumed_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing bearer token: send metadata "
                          "\"authorization: Bearer <token>\"");
    }
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ")) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "authorization metadata is not \"Bearer <token>\"");
    }
    // Compare against every token in constant time per token, so timing
    // does not reveal how much of a guess was right.
    const std::string* client = nullptr;
    for (const auto& [token, name] : tokens_) {
      if (token.size() == value.size() &&
          CRYPTO_memcmp(token.data(), value.data(), value.size()) == 0) {
        client = &name;
      }
    }
    if (client == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "bearer token not recognised");
    }
    context->AddProperty(kTokenIdentityProperty, *client);
    context->SetPeerIdentityPropertyName(kTokenIdentityProperty);
    consumed_metadata->insert(std::make_pair(
        std::string(it->first.data(), it->first.size()),
        std::string(it->second.data(), it->second.size())));
    return grpc::Status::OK;
  }

 private:
  const absl::flat_hash_map<std::string, std::string> tokens_;
};

}  // namespace

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
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both the certificate (--tls_cert) and key (--tls_key)");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain,
                   ReadFile(options.tls_cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(pair.private_key, ReadFile(options.tls_key_file, "TLS key"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadFile(options.client_ca_file, "client CA"));
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    auth->mtls_ = true;
  }
  auth->credentials_ = grpc::SslServerCredentials(ssl);
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFile(options.token_file, "token file"));
    absl::StatusOr<absl::flat_hash_map<std::string, std::string>> tokens =
        ParseTokenFile(text);
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.token_file, ": ", tokens.status().message()));
    }
    auth->credentials_->SetAuthMetadataProcessor(
        std::make_shared<TokenProcessor>(std::move(*tokens)));
    auth->tokens_ = true;
  }
  if (!auth->mtls_ && !auth->tokens_) {
    return absl::InvalidArgumentError(
        "TLS without client authentication would leave callers anonymous: "
        "add --tls_client_ca (mTLS) or --token_file (bearer tokens)");
  }
  auth->insecure_ = false;
  return auth;
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
  return absl::StrCat("TLS with ",
                      mtls_ && tokens_ ? "client certificates and bearer tokens"
                      : mtls_          ? "client certificates (mTLS)"
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
  } else {
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    // A token's client (set by the processor) wins; else the certificate's
    // first SAN, else its CN.
    std::vector<grpc::string_ref> identity;
    if (auth != nullptr) {
      identity = auth->FindPropertyValues(kTokenIdentityProperty);
      if (identity.empty()) {
        identity = auth->FindPropertyValues("x509_subject_alternative_name");
      }
      if (identity.empty()) {
        identity = auth->FindPropertyValues("x509_common_name");
      }
    }
    if (identity.empty()) {
      return absl::UnauthenticatedError(
          "the call carries no client identity (no verified client "
          "certificate and no bearer token)");
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
