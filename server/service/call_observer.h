#ifndef MATERIALIZER_SERVER_SERVICE_CALL_OBSERVER_H_
#define MATERIALIZER_SERVER_SERVICE_CALL_OBSERVER_H_

// One RPC as an operator sees it. Made where a handler starts, told what
// the handler learns (the caller, the handle, the sizes), finished with
// the status; then it writes one structured log line and records the RPC
// metrics:
//
//   CallObserver call(metrics, *context, "Describe");
//   call.SetRequestBytes(raw->Length());
//   call.SetCaller(caller);
//   call.SetRequest(request);        // the handle it names
//   ...
//   call.SetResponse(response, raw_response->Length());
//   reactor->Finish(call.End(status));
//
//   rpc peer=ipv4:127.0.0.1:50412 client=alice method=Describe
//     handle=h-... code=OK duration_ms=0.412 request_bytes=36
//     response_bytes=1290
//
// Fetches add a fetch_start (or fetch_resume) line when the stream opens
// and a fetch_end line with the bytes sent. Only names, ids, sizes and
// codes are logged: never tensor data, request bodies, tokens or
// certificates; a failed call's message is cut at kMaxErrorBytes.
//
// Why explicit calls rather than a gRPC interceptor: the identity is only
// known once the handler has authenticated the call, the handle is a field
// of a typed message (or of the response, for Materialize), and fetch
// sizes come from the stream; an interceptor sees none of these.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"

namespace materializer::service {

inline constexpr size_t kMaxErrorBytes = 256;
// Handle and session ids are 34 characters; what a client sends in their
// place is cut here, so no request can make a log line long.
inline constexpr size_t kMaxIdBytes = 64;

// Thread-compatible: one call's handler (or reactor) uses it at a time.
// `metrics` (may be null) must outlive it.
class CallObserver {
 public:
  // Copyable, so that it can ride in a std::function with the handler's
  // work.
  CallObserver(metrics::Metrics* metrics,
               const grpc::CallbackServerContext& context, const char* method);

  void SetCaller(const engine::Caller& caller);
  // The request's size on the wire, and the handle it names (its string
  // field "handle", if it has one).
  void SetRequestBytes(uint64_t bytes) { request_bytes_ = bytes; }
  void SetRequest(const google::protobuf::Message& request);
  // The response, `bytes` on the wire, and its "handle" if the request
  // named none (a handle Materialize created).
  void SetResponse(const google::protobuf::Message& response, uint64_t bytes);
  void SetSession(const std::string& session) { session_ = session; }

  // FetchWeights: the stream opened at `offset` of a `total_bytes` file
  // (logs fetch_start, or fetch_resume for a later offset), then each chunk
  // as it is written.
  void FetchOpened(uint64_t offset, uint64_t total_bytes);
  void FetchChunk(uint64_t data_bytes, uint64_t wire_bytes, bool has_digest);

  // Logs and counts the call, and returns its status for Finish
  // (service/status.h EndCall). Call it once.
  grpc::Status End(const absl::Status& status);

 private:
  metrics::Metrics* metrics_;
  const char* method_;
  std::string peer_;
  std::string client_;
  std::string session_;
  std::string handle_;
  absl::Time start_;
  uint64_t request_bytes_ = 0;
  uint64_t response_bytes_ = 0;

  // FetchWeights only.
  bool fetching_ = false;
  uint64_t fetch_offset_ = 0;
  uint64_t fetch_total_ = 0;
  uint64_t fetch_sent_ = 0;
  bool digest_sent_ = false;
};

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_CALL_OBSERVER_H_
