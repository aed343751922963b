#ifndef MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_
#define MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_

// The Attach stream: a client's session lease. The first request opens or
// resumes a session and is answered with its id; later requests are
// heartbeats. However the stream ends (the client closes it, is killed,
// loses the network and keepalive notices, or the server shuts down) the
// session is detached, which starts its grace period.

#include "absl/status/status.h"
#include "grpcpp/support/server_callback.h"
#include "materializer/v1/materializer.pb.h"
#include "server/engine/engine.h"
#include "server/registry/session.h"
#include "server/service/call_observer.h"

namespace materializer::service {

// gRPC owns the reactor; it deletes itself when done, after reporting the
// stream's end to `observer`. `sessions` must outlive the gRPC server.
grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>* StartAttach(
    registry::SessionTable* sessions, engine::Caller caller,
    CallObserver observer);

// A reactor that finishes at once with `status` (e.g. unauthenticated).
grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>* RefuseAttach(
    const absl::Status& status, CallObserver observer);

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_ATTACH_REACTOR_H_
