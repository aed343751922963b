#include "client/cli/connection.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace materializer::client::cli {
namespace {

// The token and where it came from, or none.
absl::Status LoadToken(const FlagValues& flags, const Environment& env,
                       Security* security) {
  if (flags.Has("token_file")) {
    // From --token_file, or MATERIALIZER_TOKEN_FILE through the flag table.
    const std::string path = flags.String("token_file");
    ASSIGN_OR_RETURN(security->token, ReadTokenFile(path));
    security->token_source = flags.Source("token_file") == "--token_file"
                                 ? absl::StrCat("--token_file=", path)
                                 : absl::StrCat(kTokenFileVariable, "=", path);
    if (flags.Source("token_file") != "--token_file") {
      const std::optional<std::string> inline_token = env(kTokenVariable);
      if (inline_token.has_value() && !inline_token->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "both ", kTokenVariable, " and ", kTokenFileVariable,
            " are set; set one (or pass --token_file, which wins)"));
      }
    }
    return absl::OkStatus();
  }
  const std::optional<std::string> inline_token = env(kTokenVariable);
  if (inline_token.has_value() && !inline_token->empty()) {
    security->token = *inline_token;
    security->token_source = kTokenVariable;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientOptions> ConnectionOptions(const FlagValues& flags,
                                                const Environment& env) {
  ClientOptions options;
  options.target = flags.String("server", options.target);
  options.client_name = flags.String("client");
  options.timeout = flags.Duration("timeout", options.timeout);
  options.fetch_timeout =
      flags.Duration("fetch_timeout", options.fetch_timeout);
  Security& security = options.security;
  security.tls = flags.Bool("tls");
  security.tls_ca_file = flags.String("tls_ca");
  security.tls_cert_file = flags.String("tls_cert");
  security.tls_key_file = flags.String("tls_key");
  security.tls_server_name = flags.String("tls_server_name");
  RETURN_IF_ERROR(LoadToken(flags, env, &security));
  RETURN_IF_ERROR(ValidateSecurity(security));
  return options;
}

std::string DescribeConnection(const ClientOptions& options,
                               const FlagValues& flags) {
  const std::string source =
      flags.Has("server") ? absl::StrCat(" (from ", flags.Source("server"), ")")
                          : " (the default)";
  return absl::StrCat("server ", options.target, source, "; ",
                      DescribeSecurity(options.security),
                      options.client_name.empty()
                          ? std::string()
                          : absl::StrCat("; development-mode name \"",
                                         options.client_name, "\""));
}

}  // namespace materializer::client::cli
