#ifndef MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_
#define MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_

// The Attach stream: a client's session lease. The first request opens or
// resumes a session and is answered with its id; later requests are
// heartbeats. However the stream ends (the client closes it, is killed,
// loses the network and keepalive notices, or the server shuts down) the
// session is detached, which starts its grace period.
//
// Raw messages: a request that does not parse, or is longer than
// kMaxAttachRequestBytes, ends the stream with INVALID_ARGUMENT. The
// reactions are O(1) (a session table lookup, a heartbeat); detaching,
// which releases the session's handles at once when the grace period is
// zero, runs on the worker pool.

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/thread_pool.h"
#include "server/engine/engine.h"
#include "server/registry/session.h"

namespace materializer::service {

// Largest AttachRequest accepted (its one field is a resume token of 64
// characters).
inline constexpr size_t kMaxAttachRequestBytes = 4096;

// gRPC owns the reactor; it deletes itself when done. `sessions` and
// `workers` must outlive the gRPC server.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartAttach(
    registry::SessionTable* sessions, ThreadPool* workers,
    engine::Caller caller);

// A reactor that finishes at once with `status` (e.g. unauthenticated).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* RefuseAttach(
    const absl::Status& status);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_
