#include "server/service/attach_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"
#include "server/common/happens_before.h"
#include "server/common/log.h"
#include "server/service/raw_message.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

absl::Status ParseAttachRequest(const grpc::ByteBuffer& raw,
                                v1::AttachRequest* request) {
  if (raw.Length() > kMaxAttachRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an AttachRequest of ", raw.Length(),
                     " bytes; the limit is ", kMaxAttachRequestBytes));
  }
  return ParseMessage(raw, request);
}

class AttachReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  AttachReactor(registry::SessionTable* sessions, ThreadPool* workers,
                engine::Caller caller, CallObserver observer)
      : sessions_(sessions),
        workers_(workers),
        caller_(std::move(caller)),
        observer_(std::move(observer)) {
    ReactionScope reaction(this);
    HandOffToGrpc([&] { StartRead(&raw_request_); });
  }

  void OnReadDone(bool ok) override {
    ReactionScope reaction(this);
    if (!ok) {
      // The client closed its side (or the stream broke): the lease ends.
      Detach();
      grpc::Status ended = observer_.End(absl::OkStatus());
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    v1::AttachRequest request;
    absl::Status parsed = ParseAttachRequest(raw_request_, &request);
    raw_request_.Clear();
    if (!parsed.ok()) {
      Detach();
      grpc::Status ended = observer_.End(parsed);
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    if (attached()) {  // a heartbeat
      HandOffToGrpc([&] { StartRead(&raw_request_); });
      return;
    }
    absl::StatusOr<registry::SessionTable::Attached> attached =
        request.resume_token().empty()
            ? absl::StatusOr<registry::SessionTable::Attached>(
                  sessions_->Open(caller_.identity, absl::Now()))
            : sessions_->Resume(caller_.identity, request.resume_token(),
                                absl::Now());
    if (!attached.ok()) {
      grpc::Status ended = observer_.End(attached.status());
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      attachment_ = *attached;
      attached_ = true;
    }
    observer_.SetSession(attached->session_id);
    MLOG(INFO) << (attached->resumed ? "resumed" : "opened") << " session "
               << attached->session_id << " of " << caller_.identity;
    v1::AttachResponse response;
    response.set_session_id(attached->session_id);
    response.set_resume_token(attached->resume_token);
    response.set_resumed(attached->resumed);
    *response.mutable_grace() =
        google::protobuf::util::TimeUtil::MicrosecondsToDuration(
            absl::ToInt64Microseconds(sessions_->grace()));
    if (absl::Status s = SerializeMessage(response, &raw_response_); !s.ok()) {
      Detach();
      grpc::Status ended = observer_.End(s);
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    HandOffToGrpc([&] { StartWrite(&raw_response_); });
  }

  void OnWriteDone(bool ok) override {
    ReactionScope reaction(this);
    if (!ok) {
      Detach();
      grpc::Status ended = observer_.End(absl::CancelledError("attach broken"));
      HandOffToGrpc([&] { Finish(std::move(ended)); });
      return;
    }
    HandOffToGrpc([&] { StartRead(&raw_request_); });
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
  bool attached() {
    absl::MutexLock lock(&mu_);
    return attached_;
  }

  // Starts the grace period, on a worker: with a zero grace period it
  // releases the session's handles, which may take a while.
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
    workers_->Schedule(caller_.identity, [sessions = sessions_, attachment,
                                          now = absl::Now()] {
      sessions->Detach(attachment.session_id, attachment.generation, now);
    });
  }

  registry::SessionTable* const sessions_;
  ThreadPool* const workers_;
  const engine::Caller caller_;
  // Used by the read and write reactions, which never overlap (one
  // operation is outstanding at a time), so it needs no lock.
  CallObserver observer_;
  grpc::ByteBuffer raw_request_;
  grpc::ByteBuffer raw_response_;

  // OnCancel may run on another thread than the read/write callbacks.
  absl::Mutex mu_;
  // Guards attached_ and attachment_.
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  registry::SessionTable::Attached attachment_ ABSL_GUARDED_BY(mu_);
};

// Finishes at once with an error (e.g. the caller is not authenticated).
class RefusedAttach final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RefusedAttach(const absl::Status& status, CallObserver observer) {
    ReactionScope reaction(this);
    grpc::Status ended = observer.End(status);
    HandOffToGrpc([&] { Finish(std::move(ended)); });
  }
  void OnDone() override {
    HappensAfter(this);
    delete this;
  }
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartAttach(
    registry::SessionTable* sessions, ThreadPool* workers,
    engine::Caller caller, CallObserver observer) {
  if (sessions == nullptr) {
    return new RefusedAttach(
        absl::FailedPreconditionError("this server has no sessions"),
        std::move(observer));
  }
  return new AttachReactor(sessions, workers, std::move(caller),
                           std::move(observer));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* RefuseAttach(
    const absl::Status& status, CallObserver observer) {
  return new RefusedAttach(status, std::move(observer));
}

}  // namespace materializer::service
