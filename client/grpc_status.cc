#include "client/grpc_status.h"

namespace materializer::client {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share the canonical numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace materializer::client
