#ifndef MATERIALIZER_SERVER_SERVICE_STATUS_H_
#define MATERIALIZER_SERVER_SERVICE_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace materializer::service {

// Longest status message sent, counted as it travels in the grpc-message
// trailer (percent-encoded: bytes outside printable ASCII, and '%', take
// three). gRPC refuses metadata over 16 KiB and, with growing
// probability, over 8 KiB; 4 KiB stays well under both.
inline constexpr size_t kMaxStatusWireBytes = 4096;

// The one place where core statuses become gRPC statuses. Codes map 1:1
// (absl and gRPC share the canonical code space); the message is kept,
// except that a message longer than kMaxStatusWireBytes on the wire keeps
// its beginning and its end (where messages say what to do) and says how
// much was cut between them. Inputs should already be quoted in part
// (common/quote.h); this is the backstop for any that are not.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Every RPC ends here, exactly once, with its final status: unary calls,
// fetch streams and Attach streams alike. `method` is the RPC's name
// ("Plan"). The single place to observe how calls end (metrics, logs).
grpc::Status EndCall(absl::string_view method, const absl::Status& status);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_STATUS_H_
