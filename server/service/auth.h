#ifndef MATERIALIZER_SERVER_SERVICE_AUTH_H_
#define MATERIALIZER_SERVER_SERVICE_AUTH_H_

// Who is calling. Identity comes from the transport's authentication,
// never from a request field.
//
// Today's one mode is an explicit development mode for loopback only: the
// client names itself in the call metadata key `x-materializer-client`.
// The server refuses to start this mode on a non-loopback address unless
// told otherwise, and logs a warning either way.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "server/engine/engine.h"

namespace materializer::service {

inline constexpr char kClientMetadataKey[] = "x-materializer-client";
inline constexpr char kAnonymous[] = "anonymous";

// Thread-safe (stateless).
class Authenticator {
 public:
  // UNAUTHENTICATED if the claimed name is malformed (1..128 characters of
  // [A-Za-z0-9._@:+-]).
  absl::StatusOr<engine::Caller> Authenticate(
      const grpc::CallbackServerContext& context) const;
};

// The reason `name` is not an acceptable client name, or "".
std::string ClientNameProblem(absl::string_view name);

// True for 127.0.0.0/8, ::1 and "localhost" (with any port).
bool IsLoopbackAddress(absl::string_view address);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_AUTH_H_
