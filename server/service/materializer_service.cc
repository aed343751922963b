#include "server/service/materializer_service.h"

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/happens_before.h"
#include "server/common/status_macros.h"
#include "server/service/attach_reactor.h"
#include "server/service/call_observer.h"
#include "server/service/fetch_reactor.h"
#include "server/service/raw_message.h"
#include "server/service/server_info.h"
#include "server/service/status.h"

namespace materializer::service {
namespace {

using Cancelled = std::function<bool()>;

// True once the caller is gone: it cancelled, the connection broke, or the
// call's deadline passed.
Cancelled CancelledBy(grpc::CallbackServerContext* context) {
  return [context] {
    return context->IsCancelled() ||
           std::chrono::system_clock::now() > context->deadline();
  };
}

absl::Status QueueFull(const std::string& client, const ThreadPool& workers) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "client ", client, " already has ", workers.max_queued_per_key(),
      " calls waiting for a worker, the most one client may queue; retry "
      "when some of them have finished"));
}

// Parses the request, runs `call` unless the caller has gone already, and
// serializes its answer, telling `observer` what the call was about.
template <typename Request, typename Call>
absl::Status RunUnary(const grpc::ByteBuffer& raw_request,
                      grpc::ByteBuffer* raw_response,
                      const engine::Caller& caller, const Cancelled& cancelled,
                      CallObserver* observer, const Call& call) {
  if (cancelled()) {
    return absl::CancelledError(
        "the call was cancelled, or its deadline passed, before a worker "
        "took it; nothing was done");
  }
  Request request;
  RETURN_IF_ERROR(ParseMessage(raw_request, &request));
  observer->SetRequest(request);
  auto result = call(caller, request, cancelled);
  if (!result.ok()) return result.status();
  RETURN_IF_ERROR(SerializeMessage(*result, raw_response));
  observer->SetResponse(*result, raw_response->Length());
  return absl::OkStatus();
}

}  // namespace

MaterializerService::MaterializerService(engine::Engine* engine,
                                         ThreadPool* workers,
                                         const Authenticator* authenticator,
                                         registry::SessionTable* sessions,
                                         metrics::Metrics* metrics,
                                         std::string replica,
                                         std::string advertised_address)
    : engine_(engine),
      workers_(workers),
      authenticator_(authenticator),
      sessions_(sessions),
      metrics_(metrics),
      replica_(std::move(replica)),
      advertised_address_(std::move(advertised_address)) {}

template <typename Request, typename Call>
grpc::ServerUnaryReactor* MaterializerService::Unary(
    const char* method, grpc::CallbackServerContext* context,
    const Raw* request, Raw* response, Call call) {
  Reactor* reactor = context->DefaultReactor();
  CallObserver observer(metrics_, *context, method);
  observer.SetRequestBytes(request->Length());
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
  if (!caller.ok()) {
    grpc::Status refused = observer.End(caller.status());
    HandOffToGrpc([&] { reactor->Finish(std::move(refused)); });
    return reactor;
  }
  observer.SetCaller(*caller);
  const std::string client = caller->identity;
  // gRPC keeps `request`, `response` and `context` until Finish. The work
  // has its own copy of the observer; ours reports a full queue.
  auto work = [reactor, request, response, observer,
               cancelled = CancelledBy(context), call = std::move(call),
               caller = std::move(*caller)]() mutable {
    grpc::Status status = observer.End(RunUnary<Request>(
        *request, response, caller, cancelled, &observer, call));
    HandOffToGrpc([&] { reactor->Finish(std::move(status)); });
  };
  if (!workers_->TrySchedule(client, std::move(work))) {
    grpc::Status full = observer.End(QueueFull(client, *workers_));
    HandOffToGrpc([&] { reactor->Finish(std::move(full)); });
  }
  return reactor;
}

grpc::ServerUnaryReactor* MaterializerService::Plan(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::PlanRequest>(
      "Plan", context, request, response,
      [this](const engine::Caller& caller, const v1::PlanRequest& r,
             const Cancelled& cancelled) {
        return engine_->Plan(caller, r, cancelled);
      });
}

grpc::ServerUnaryReactor* MaterializerService::Materialize(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::MaterializeRequest>(
      "Materialize", context, request, response,
      [this](const engine::Caller& caller, const v1::MaterializeRequest& r,
             const Cancelled& cancelled) {
        // Stops, and rolls back, once the caller is gone.
        return engine_->Materialize(caller, r, cancelled);
      });
}

grpc::ServerUnaryReactor* MaterializerService::Describe(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::DescribeRequest>(
      "Describe", context, request, response,
      [this](const engine::Caller& caller, const v1::DescribeRequest& r,
             const Cancelled& cancelled) {
        return engine_->Describe(caller, r, cancelled);
      });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* MaterializerService::FetchWeights(
    grpc::CallbackServerContext* context, const Raw* raw) {
  CallObserver observer(metrics_, *context, "FetchWeights");
  observer.SetRequestBytes(raw->Length());
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
  if (!caller.ok()) return RefuseFetch(caller.status(), std::move(observer));
  observer.SetCaller(*caller);
  const std::string client = caller->identity;
  Cancelled cancelled = CancelledBy(context);
  return StartFetch(
      workers_, client,
      [this, raw, cancelled,
       caller = std::move(*caller)](CallObserver* observer)
          -> absl::StatusOr<std::unique_ptr<delivery::WeightStream>> {
        v1::FetchRequest request;
        RETURN_IF_ERROR(ParseMessage(*raw, &request));
        observer->SetRequest(request);
        return engine_->OpenFetch(caller, request, cancelled);
      },
      cancelled, QueueFull(client, *workers_), std::move(observer));
}

grpc::ServerUnaryReactor* MaterializerService::DescribeFile(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  // The first DescribeFile of a file hashes all of it.
  return Unary<v1::FetchRequest>(
      "DescribeFile", context, request, response,
      [this](const engine::Caller& caller, const v1::FetchRequest& r,
             const Cancelled& cancelled) {
        return engine_->DescribeFile(caller, r, cancelled);
      });
}

grpc::ServerUnaryReactor* MaterializerService::ExportHandle(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::ExportRequest>(
      "ExportHandle", context, request, response,
      [this](const engine::Caller& caller, const v1::ExportRequest& r,
             const Cancelled&) { return engine_->ExportHandle(caller, r); });
}

grpc::ServerUnaryReactor* MaterializerService::CloseExport(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  // Closing the last CUDA export of a released handle frees its memory.
  return Unary<v1::CloseExportRequest>(
      "CloseExport", context, request, response,
      [this](const engine::Caller& caller, const v1::CloseExportRequest& r,
             const Cancelled&) { return engine_->CloseExport(caller, r); });
}

grpc::ServerUnaryReactor* MaterializerService::Release(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::ReleaseRequest>(
      "Release", context, request, response,
      [this](const engine::Caller& caller, const v1::ReleaseRequest& r,
             const Cancelled&) { return engine_->Release(caller, r); });
}

grpc::ServerUnaryReactor* MaterializerService::ListHandles(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::ListHandlesRequest>(
      "ListHandles", context, request, response,
      [this](const engine::Caller& caller, const v1::ListHandlesRequest&,
             const Cancelled&) -> absl::StatusOr<v1::ListHandlesResponse> {
        return engine_->ListHandles(caller);
      });
}

grpc::ServerUnaryReactor* MaterializerService::GetStats(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::GetStatsRequest>(
      "GetStats", context, request, response,
      [this](const engine::Caller& caller, const v1::GetStatsRequest&,
             const Cancelled&) -> absl::StatusOr<v1::GetStatsResponse> {
        return engine_->GetStats(caller);
      });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
MaterializerService::Attach(grpc::CallbackServerContext* context) {
  CallObserver observer(metrics_, *context, "Attach");
  absl::StatusOr<engine::Caller> caller =
      authenticator_->Authenticate(*context);
  if (!caller.ok()) return RefuseAttach(caller.status(), std::move(observer));
  observer.SetCaller(*caller);
  return StartAttach(sessions_, workers_, std::move(*caller),
                     std::move(observer));
}

grpc::ServerUnaryReactor* MaterializerService::Renew(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::RenewRequest>(
      "Renew", context, request, response,
      [this](const engine::Caller& caller, const v1::RenewRequest& r,
             const Cancelled&) { return engine_->Renew(caller, r); });
}

grpc::ServerUnaryReactor* MaterializerService::GetServerInfo(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::GetServerInfoRequest>(
      "GetServerInfo", context, request, response,
      [this](const engine::Caller& caller, const v1::GetServerInfoRequest&,
             const Cancelled&) -> absl::StatusOr<v1::ServerInfo> {
        return ServerInfoFromStats(replica_, advertised_address_,
                                   engine_->GetStats(caller));
      });
}

grpc::ServerUnaryReactor* MaterializerService::InspectCheckpoint(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return Unary<v1::InspectCheckpointRequest>(
      "InspectCheckpoint", context, request, response,
      [this](const engine::Caller& caller,
             const v1::InspectCheckpointRequest& r,
             const Cancelled& cancelled) {
        return engine_->InspectCheckpoint(caller, r, cancelled);
      });
}

}  // namespace materializer::service
