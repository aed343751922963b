#include "client/credentials.h"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/status_macros.h"

namespace materializer::client {
namespace {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot read the ", what, " ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot read the ", what, " ", path));
  }
  return text.str();
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view what) {
  ASSIGN_OR_RETURN(std::string pem, ReadWholeFile(path, what));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " ", path, " holds no PEM block"));
  }
  return pem;
}

}  // namespace

absl::Status ValidateSecurity(const Security& security) {
  const std::string source =
      security.token_source.empty()
          ? std::string("the token")
          : absl::StrCat("the token from ", security.token_source);
  if (!security.token.empty()) {
    if (!security.UsesTls()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source,
          " is sent only over TLS: name the CA of the server's certificate "
          "(--tls_ca / MATERIALIZER_TLS_CA), or --tls to trust the "
          "system's roots"));
    }
    for (const char c : security.token) {
      // It travels as an HTTP/2 header value; anything else would fail
      // every call with an opaque error.
      if (c <= 0x20 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat(
            source,
            " contains a space or a character outside printable ASCII; a "
            "token is one word"));
      }
    }
  }
  if (security.tls_cert_file.empty() != security.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key and the key its certificate: "
        "give both --tls_cert and --tls_key, or neither");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const Security& security) {
  RETURN_IF_ERROR(ValidateSecurity(security));
  if (!security.UsesTls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!security.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs,
                     ReadPem(security.tls_ca_file, "CA file"));
  }
  if (!security.tls_cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                     ReadPem(security.tls_cert_file, "client certificate"));
    ASSIGN_OR_RETURN(ssl.pem_private_key,
                     ReadPem(security.tls_key_file, "client key"));
  }
  std::shared_ptr<grpc::ChannelCredentials> channel = grpc::SslCredentials(ssl);
  if (security.token.empty()) return channel;
  return grpc::CompositeChannelCredentials(
      channel, grpc::AccessTokenCredentials(security.token));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path, "token file"));
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the token file ", path, " is empty"));
  }
  if (absl::StrContains(token, '\n')) {
    return absl::InvalidArgumentError(
        absl::StrCat("the token file ", path,
                     " holds more than one line; it must hold "
                     "only the token"));
  }
  return std::string(token);
}

std::string DescribeSecurity(const Security& security) {
  std::vector<std::string> parts;
  if (!security.UsesTls()) {
    parts.push_back("plaintext (the server's development mode)");
  } else {
    parts.push_back(absl::StrCat("TLS, server checked against ",
                                 security.tls_ca_file.empty()
                                     ? std::string("the system's roots")
                                     : security.tls_ca_file));
    if (!security.tls_server_name.empty()) {
      parts.push_back(absl::StrCat("as \"", security.tls_server_name, "\""));
    }
    if (!security.tls_cert_file.empty()) {
      parts.push_back(absl::StrCat("client certificate ",
                                   security.tls_cert_file, " (mTLS)"));
    }
  }
  if (!security.token.empty()) {
    parts.push_back(absl::StrCat("bearer token from ",
                                 security.token_source.empty()
                                     ? std::string("the caller")
                                     : security.token_source,
                                 " (", security.token.size(), " characters)"));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace materializer::client
