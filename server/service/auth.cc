#include "server/service/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace materializer::service {

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

absl::StatusOr<engine::Caller> Authenticator::Authenticate(
    const grpc::CallbackServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientMetadataKey);
  if (it == metadata.end()) return engine::Caller{kAnonymous};
  const absl::string_view name(it->second.data(), it->second.size());
  if (std::string problem = ClientNameProblem(name); !problem.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("metadata ", kClientMetadataKey, ": ", problem));
  }
  return engine::Caller{std::string(name)};
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
