#include "server/service/attach_reactor.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"
#include "server/common/happens_before.h"
#include "server/common/log.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

class AttachReactor final
    : public grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse> {
 public:
  AttachReactor(registry::SessionTable* sessions, engine::Caller caller,
                CallObserver observer)
      : sessions_(sessions),
        caller_(std::move(caller)),
        observer_(std::move(observer)) {
    ReactionScope reaction(this);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this);
    if (!ok) {
      // The client closed its side (or the stream broke): the lease ends.
      Detach();
      Done(grpc::Status::OK);
      return;
    }
    if (attached_) {  // a heartbeat
      StartRead(&request_);
      return;
    }
    absl::StatusOr<registry::SessionTable::Attached> attached =
        request_.resume_token().empty()
            ? absl::StatusOr<registry::SessionTable::Attached>(
                  sessions_->Open(caller_.identity, absl::Now()))
            : sessions_->Resume(caller_.identity, request_.resume_token(),
                                absl::Now());
    if (!attached.ok()) {
      Done(ToGrpcStatus(attached.status()));
      return;
    }
    observer_.SetSession(attached->session_id);
    {
      absl::MutexLock lock(&mu_);
      attachment_ = *attached;
      attached_ = true;
    }
    MLOG(INFO) << (attached->resumed ? "resumed" : "opened") << " session "
               << attached->session_id << " of " << caller_.identity;
    response_.set_session_id(attached->session_id);
    response_.set_resume_token(attached->resume_token);
    response_.set_resumed(attached->resumed);
    *response_.mutable_grace() =
        google::protobuf::util::TimeUtil::MicrosecondsToDuration(
            absl::ToInt64Microseconds(sessions_->grace()));
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this);
    if (!ok) {
      Detach();
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "attach broken"));
      return;
    }
    StartRead(&request_);
  }

  // The client went away (killed, network lost, deadline) or the server is
  // shutting down. May run alongside a read or write reaction (mu_).
  void OnCancel() override {
    ReactionScope reaction(this);
    Detach();
  }

  void OnDone() override {
    HappensAfter(this);
    Detach();
    delete this;
  }

 private:
  // Read and write reactions do not overlap (one operation is outstanding
  // at a time), so observer_ needs no lock.
  void Done(grpc::Status status) {
    observer_.Finish(status);
    Finish(std::move(status));
  }

  void Detach() {
    registry::SessionTable::Attached attachment;
    {
      absl::MutexLock lock(&mu_);
      if (!attached_) return;
      attached_ = false;
      attachment = attachment_;
    }
    MLOG(INFO) << "session " << attachment.session_id << " of "
               << caller_.identity << " detached; grace "
               << absl::FormatDuration(sessions_->grace());
    sessions_->Detach(attachment.session_id, attachment.generation,
                      absl::Now());
  }

  registry::SessionTable* const sessions_;
  const engine::Caller caller_;
  CallObserver observer_;
  v1::AttachRequest request_;
  v1::AttachResponse response_;

  // OnCancel may run on another thread than the read/write callbacks.
  absl::Mutex mu_;
  // Guards attached_ and attachment_.
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  registry::SessionTable::Attached attachment_ ABSL_GUARDED_BY(mu_);
};

// Finishes at once with an error (e.g. the caller is not authenticated).
class RefusedAttach final
    : public grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse> {
 public:
  RefusedAttach(grpc::Status status, CallObserver observer) {
    ReactionScope reaction(this);
    observer.Finish(status);
    Finish(std::move(status));
  }
  void OnDone() override {
    HappensAfter(this);
    delete this;
  }
};

}  // namespace

grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>* StartAttach(
    registry::SessionTable* sessions, engine::Caller caller,
    CallObserver observer) {
  if (sessions == nullptr) {
    return new RefusedAttach(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "this server has no sessions"),
                             std::move(observer));
  }
  return new AttachReactor(sessions, std::move(caller), std::move(observer));
}

grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>* RefuseAttach(
    const absl::Status& status, CallObserver observer) {
  return new RefusedAttach(ToGrpcStatus(status), std::move(observer));
}

}  // namespace materializer::service
