#include "client/session.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/grpc_status.h"

namespace materializer::client {

SessionKeeper::SessionKeeper(v1::Materializer::Stub* stub,
                             std::function<void(grpc::ClientContext*)> prepare)
    : stub_(stub), prepare_(std::move(prepare)) {
  absl::MutexLock lock(&mu_);
  last_error_ = absl::UnavailableError("attaching");
  thread_ = std::thread([this] { Run(); });
}

SessionKeeper::~SessionKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Half-close: the server sees the end of the stream and detaches the
    // session (a clean end; its grace period starts). Cancel as a fallback
    // in case the server does not finish the call.
    if (stream_ != nullptr) stream_->WritesDone();
    if (context_ != nullptr) context_->TryCancel();
  }
  thread_.join();
}

absl::StatusOr<std::string> SessionKeeper::WaitForSession(
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !session_id_.empty() || stopping_ || given_up_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!session_id_.empty()) return session_id_;
  return last_error_;
}

int SessionKeeper::resumes() const {
  absl::MutexLock lock(&mu_);
  return resumes_;
}

void SessionKeeper::Run() {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    grpc::ClientContext context;
    prepare_(&context);
    v1::AttachRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      request.set_resume_token(resume_token_);
    }
    std::unique_ptr<grpc::ClientReaderWriter<v1::AttachRequest,
                                             v1::AttachResponse>>
        stream = stub_->Attach(&context);
    {
      absl::MutexLock lock(&mu_);
      context_ = &context;
      stream_ = stream.get();
      if (stopping_) context.TryCancel();
    }
    v1::AttachResponse response;
    const bool attached = stream->Write(request) && stream->Read(&response);
    if (attached) {
      absl::MutexLock lock(&mu_);
      if (!session_id_.empty() && response.session_id() == session_id_) {
        ++resumes_;
      }
      session_id_ = response.session_id();
      resume_token_ = response.resume_token();
      last_error_ = absl::OkStatus();
      backoff = absl::Milliseconds(100);
    }
    // The server sends nothing more: Read returns when the stream ends.
    while (attached && stream->Read(&response)) {
    }
    const grpc::Status status = stream->Finish();
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      stream_ = nullptr;
      if (stopping_) return;
      if (!attached) last_error_ = FromGrpcStatus(status);
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        // The session ended (its handles with it): start a new one.
        resume_token_.clear();
        session_id_.clear();
      } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                 status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
                 status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                 status.error_code() ==
                     grpc::StatusCode::FAILED_PRECONDITION) {
        // Retrying cannot help: keep the error for callers and stop.
        session_id_.clear();
        last_error_ = FromGrpcStatus(status);
        given_up_ = true;
        return;
      }
    }
    // Retry (resume) after a pause, unless we are stopping.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace materializer::client
