#ifndef MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
#define MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_

// The FetchWeights stream on gRPC's raw callback API: each chunk of an
// opened WeightStream goes out as a serialized WeightChunk whose `data`
// bytes are slices referencing the arena (CPU) or the chunk's own buffer
// (the last chunk, CUDA staging), so tensor bytes are not copied into a
// message. Chunks are written one at a time: the next is produced only when
// the previous write completed, so a fetch holds one chunk in flight
// whatever the model size (docs/delivery.md states the bound).

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "materializer/v1/materializer.pb.h"
#include "server/delivery/weight_stream.h"
#include "server/service/call_observer.h"

namespace materializer::service {

// A reactor that streams `stream`, or finishes at once with its error,
// reporting the stream and its end to `observer`. gRPC owns it; it deletes
// itself when done.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(
    absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream,
    CallObserver observer);

// The request of a raw FetchWeights call; INVALID_ARGUMENT if it does not
// parse.
absl::StatusOr<v1::FetchRequest> ParseFetchRequest(
    const grpc::ByteBuffer& raw);

// `chunk` as the wire bytes of a v1::WeightChunk. Pieces of at least
// kMinZeroCopyBytes become slices that reference their memory (and hold
// its keepalive until gRPC lets go of them); smaller ones are copied.
grpc::ByteBuffer EncodeChunk(const delivery::WeightStream::Chunk& chunk);

inline constexpr uint64_t kMinZeroCopyBytes = 16 << 10;

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
