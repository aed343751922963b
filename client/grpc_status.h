#ifndef MATERIALIZER_CLIENT_GRPC_STATUS_H_
#define MATERIALIZER_CLIENT_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace materializer::client {

// The one place that maps a gRPC status to an absl::Status: same code, same
// message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_GRPC_STATUS_H_
