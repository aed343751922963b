#include "server/service/materializer_service.h"

#include <memory>
#include <utility>

#include "server/common/log.h"
#include "server/service/attach_reactor.h"
#include "server/service/fetch_reactor.h"
#include "server/service/server_info.h"
#include "server/service/status.h"

namespace materializer::service {

MaterializerService::MaterializerService(engine::Engine* engine,
                                         ThreadPool* workers,
                                         const Authenticator* authenticator,
                                         registry::SessionTable* sessions,
                                         std::string replica,
                                         std::string advertised_address)
    : engine_(engine),
      workers_(workers),
      authenticator_(authenticator),
      sessions_(sessions),
      replica_(std::move(replica)),
      advertised_address_(std::move(advertised_address)) {}

template <typename Response, typename Call>
grpc::ServerUnaryReactor* MaterializerService::Unary(
    grpc::CallbackServerContext* context, Response* response, bool offload,
    Call call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
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
               [this, request, context](const engine::Caller& caller) {
                 // Stop initializing, and roll back, once the caller is gone.
                 return engine_->Materialize(
                     caller, *request, [context] { return context->IsCancelled(); });
               });
}

grpc::ServerUnaryReactor* MaterializerService::Describe(
    grpc::CallbackServerContext* context, const v1::DescribeRequest* request,
    v1::HandleInfo* response) {
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->Describe(caller, *request);
               });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* MaterializerService::FetchWeights(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
  if (!caller.ok()) return StartFetch(caller.status());
  absl::StatusOr<v1::FetchRequest> request = ParseFetchRequest(*raw);
  if (!request.ok()) return StartFetch(request.status());
  return StartFetch(engine_->OpenFetch(*caller, *request));
}

grpc::ServerUnaryReactor* MaterializerService::DescribeFile(
    grpc::CallbackServerContext* context, const v1::FetchRequest* request,
    v1::FileLayout* response) {
  // The first DescribeFile of a file hashes all of it.
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->DescribeFile(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::ExportHandle(
    grpc::CallbackServerContext* context, const v1::ExportRequest* request,
    v1::ExportResponse* response) {
  return Unary(context, response, /*offload=*/false,
               [this, request](const engine::Caller& caller) {
                 return engine_->ExportHandle(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::CloseExport(
    grpc::CallbackServerContext* context,
    const v1::CloseExportRequest* request,
    v1::CloseExportResponse* response) {
  // Closing the last CUDA export of a released handle frees its memory.
  return Unary(context, response, /*offload=*/true,
               [this, request](const engine::Caller& caller) {
                 return engine_->CloseExport(caller, *request);
               });
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

grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>*
MaterializerService::Attach(grpc::CallbackServerContext* context) {
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
  if (!caller.ok()) return RefuseAttach(caller.status());
  return StartAttach(sessions_, std::move(*caller));
}

grpc::ServerUnaryReactor* MaterializerService::Renew(
    grpc::CallbackServerContext* context, const v1::RenewRequest* request,
    v1::RenewResponse* response) {
  return Unary(context, response, /*offload=*/false,
               [this, request](const engine::Caller& caller) {
                 return engine_->Renew(caller, *request);
               });
}

grpc::ServerUnaryReactor* MaterializerService::GetServerInfo(
    grpc::CallbackServerContext* context,
    const v1::GetServerInfoRequest* /*request*/, v1::ServerInfo* response) {
  return Unary(context, response, /*offload=*/false,
               [this](const engine::Caller& caller)
                   -> absl::StatusOr<v1::ServerInfo> {
                 return ServerInfoFromStats(replica_, advertised_address_,
                                            engine_->GetStats(caller));
               });
}

}  // namespace materializer::service
