#include "server/service/materializer_service.h"

#include <memory>
#include <utility>

#include "server/common/log.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

// Streams one fetch. Writes one chunk at a time: the next chunk is produced
// only after the previous write completed, so server memory per fetch is one
// chunk regardless of model size. Deletes itself when gRPC is done with it.
class FetchReactor final : public grpc::ServerWriteReactor<v1::WeightChunk> {
 public:
  explicit FetchReactor(std::unique_ptr<delivery::WeightStream> stream)
      : stream_(std::move(stream)) {
    WriteNext();
  }

  // A failed open: finish at once with the error.
  explicit FetchReactor(const absl::Status& status) {
    Finish(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client went away or cancelled; stop producing and let go of the
      // arena at once.
      stream_.reset();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (stream_ == nullptr) {  // the last chunk has been written
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status status = stream_->Next(&chunk_);
    if (!status.ok()) {
      MLOG(ERROR) << "fetch failed mid-stream: " << status;
      stream_.reset();
      Finish(ToGrpcStatus(status));
      return;
    }
    // The last chunk is a copy: let go of the arena now, not when gRPC gets
    // round to OnDone, so a Release right after the client read everything
    // frees the memory at once.
    if (stream_->done()) stream_.reset();
    StartWrite(&chunk_);
  }

  std::unique_ptr<delivery::WeightStream> stream_;
  v1::WeightChunk chunk_;
};

}  // namespace

MaterializerService::MaterializerService(engine::Engine* engine,
                                         ThreadPool* workers)
    : engine_(engine), workers_(workers) {}

template <typename Response, typename Call>
grpc::ServerUnaryReactor* MaterializerService::Unary(
    grpc::CallbackServerContext* context, Response* response, bool offload,
    Call call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<engine::Caller> caller =
      authenticator_.Authenticate(*context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  auto run = [reactor, response, call = std::move(call),
              caller = std::move(*caller)]() mutable {
    absl::StatusOr<Response> result = call(caller);
    if (result.ok()) *response = std::move(*result);
    reactor->Finish(ToGrpcStatus(result.status()));
  };
  if (offload) {
    workers_->Schedule(std::move(run));
  } else {
    run();
  }
  return reactor;
}

grpc::ServerUnaryReactor* MaterializerService::Plan(
    grpc::CallbackServerContext* context, const v1::PlanRequest* request,
    v1::PlanResponse* response) {
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->Plan(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::Materialize(
    grpc::CallbackServerContext* context,
    const v1::MaterializeRequest* request,
    v1::MaterializeResponse* response) {
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->Materialize(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::Describe(
    grpc::CallbackServerContext* context, const v1::DescribeRequest* request,
    v1::HandleInfo* response) {
  return Unary(context, response, /*offload=*/false,
               [this, request](const engine::Caller& caller) {
                 return engine_->Describe(caller, *request);
               });
}

grpc::ServerWriteReactor<v1::WeightChunk>* MaterializerService::FetchWeights(
    grpc::CallbackServerContext* context, const v1::FetchRequest* request) {
  absl::StatusOr<engine::Caller> caller =
      authenticator_.Authenticate(*context);
  if (!caller.ok()) return new FetchReactor(caller.status());
  absl::StatusOr<std::unique_ptr<delivery::WeightStream>> stream =
      engine_->OpenFetch(*caller, *request);
  if (!stream.ok()) return new FetchReactor(stream.status());
  return new FetchReactor(std::move(*stream));
}

grpc::ServerUnaryReactor* MaterializerService::Release(
    grpc::CallbackServerContext* context, const v1::ReleaseRequest* request,
    v1::ReleaseResponse* response) {
  // Unmapping a large arena takes a while; keep it off the callback thread.
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->Release(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::ListHandles(
    grpc::CallbackServerContext* context,
    const v1::ListHandlesRequest* /*request*/,
    v1::ListHandlesResponse* response) {
  return Unary(context, response, /*offload=*/false,
               [this](const engine::Caller& caller)
                   -> absl::StatusOr<v1::ListHandlesResponse> {
                 return engine_->ListHandles(caller);
               });
}

grpc::ServerUnaryReactor* MaterializerService::GetStats(
    grpc::CallbackServerContext* context,
    const v1::GetStatsRequest* /*request*/, v1::GetStatsResponse* response) {
  return Unary(context, response, /*offload=*/false,
               [this](const engine::Caller& caller)
                   -> absl::StatusOr<v1::GetStatsResponse> {
                 return engine_->GetStats(caller);
               });
}

}  // namespace materializer::service
