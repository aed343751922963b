#ifndef MATERIALIZER_CLIENT_SESSION_H_
#define MATERIALIZER_CLIENT_SESSION_H_

// The client side of a session: keeps one Attach stream open for as long as
// the object lives, so the handles created in the session live as long as
// the client does (and are released by the server, after its grace period,
// when the client goes away however it goes away). A broken stream is
// re-attached with the resume token, with backoff, until the server says
// the session is gone.
//
//   SessionKeeper keeper(stub, metadata);
//   ASSIGN_OR_RETURN(std::string id, keeper.WaitForSession(absl::Seconds(30)));
//   context.AddMetadata("x-materializer-session", id);

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "materializer/v1/materializer.grpc.pb.h"

namespace materializer::client {

inline constexpr char kSessionMetadataKey[] = "x-materializer-session";

// Thread-safe. Destruction ends the session cleanly (the stream is
// half-closed; the server releases the session's handles after its grace
// period).
class SessionKeeper {
 public:
  // `prepare` adds identity metadata (and credentials) to each Attach call.
  SessionKeeper(v1::Materializer::Stub* stub,
                std::function<void(grpc::ClientContext*)> prepare);
  ~SessionKeeper();

  SessionKeeper(const SessionKeeper&) = delete;
  SessionKeeper& operator=(const SessionKeeper&) = delete;

  // The session id once attached; the error of the last attempt if no
  // session came within `timeout` (e.g. UNIMPLEMENTED from an old server,
  // UNAUTHENTICATED).
  absl::StatusOr<std::string> WaitForSession(absl::Duration timeout);

  // How many times the stream broke and was resumed.
  int resumes() const;

 private:
  void Run();

  v1::Materializer::Stub* const stub_;
  const std::function<void(grpc::ClientContext*)> prepare_;

  mutable absl::Mutex mu_;
  // Guards every member below.
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  std::string resume_token_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool given_up_ ABSL_GUARDED_BY(mu_) = false;
  int resumes_ ABSL_GUARDED_BY(mu_) = 0;
  // The live call, so the destructor can end it.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<v1::AttachRequest, v1::AttachResponse>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;

  std::thread thread_;
};

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_SESSION_H_
