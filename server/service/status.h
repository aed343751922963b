#ifndef MATERIALIZER_SERVER_SERVICE_STATUS_H_
#define MATERIALIZER_SERVER_SERVICE_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace materializer::service {

// The one place where core statuses become gRPC statuses. Codes map 1:1
// (absl and gRPC share the canonical code space); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_STATUS_H_
