#ifndef MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
#define MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_

// The FetchWeights stream: chunks of an opened WeightStream written one at a
// time, so a fetch holds one chunk of server memory whatever the model size.

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/support/server_callback.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/weight_stream.h"

namespace materializer::service {

// A reactor that streams `stream`, or finishes at once with its error. gRPC
// owns it; it deletes itself when done.
grpc::ServerWriteReactor<v1::WeightChunk>* StartFetch(
    absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
