#ifndef MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
#define MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_

// The FetchWeights stream on gRPC's raw callback API: each chunk of an
// opened WeightStream goes out as a serialized WeightChunk whose `data`
// bytes are slices referencing the arena (CPU) or the chunk's own buffer
// (the last chunk, CUDA staging), so tensor bytes are not copied into a
// message. Chunks are written one at a time: the next is produced only when
// the previous write completed, so a fetch holds one chunk in flight
// whatever the model size (docs/delivery.md states the bound).
//
// Threads: opening the stream (parsing the request, filters, layout,
// checksums) and producing every chunk (reading, hashing, staging copies)
// run on the worker pool under the client's key, one step at a time; gRPC's
// callback threads only see write completions.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/thread_pool.h"
#include "server/delivery/weight_stream.h"

namespace materializer::service {

using OpenStream =
    std::function<absl::StatusOr<std::unique_ptr<delivery::WeightStream>>()>;

// A reactor that runs `open` on `workers` under `client`, then streams what
// it opened (or finishes with its error). If the caller is gone
// (`cancelled`) before a worker takes it, `open` does not run; if the
// client's queue is full, the reactor finishes at once with `queue_full`.
// gRPC owns the reactor; it deletes itself when done. `workers` must
// outlive the gRPC server.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartFetch(
    ThreadPool* workers, std::string client, OpenStream open,
    std::function<bool()> cancelled, absl::Status queue_full);

// A reactor that finishes at once with `status` (e.g. unauthenticated).
grpc::ServerWriteReactor<grpc::ByteBuffer>* RefuseFetch(
    const absl::Status& status);

// `chunk` as the wire bytes of a v1::WeightChunk. Pieces of at least
// kMinZeroCopyBytes become slices that reference their memory (and hold
// its keepalive until gRPC lets go of them); smaller ones are copied.
grpc::ByteBuffer EncodeChunk(const delivery::WeightStream::Chunk& chunk);

inline constexpr uint64_t kMinZeroCopyBytes = 16 << 10;

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_FETCH_REACTOR_H_
