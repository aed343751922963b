#ifndef MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_
#define MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_

// The gRPC adapter for materializer.v1.Materializer (callback API). Each
// handler authenticates, calls the engine, converts the status, and
// finishes; no business logic lives here. Calls that can take long (Plan,
// Materialize) run on the worker pool so gRPC's callback threads stay free.

#include <string>

#include "materializer/v1/materializer.grpc.pb.h"
#include "server/common/thread_pool.h"
#include "server/engine/engine.h"
#include "server/registry/session.h"
#include "server/service/auth.h"

namespace materializer::service {

// Thread-safe. The engine and worker pool must outlive the gRPC server that
// serves this service.
//
// FetchWeights uses the raw callback API: its chunks are written as
// serialized messages whose bytes reference the arena (fetch_reactor.h).
class MaterializerService final
    : public v1::Materializer::WithRawCallbackMethod_FetchWeights<
          v1::Materializer::CallbackService> {
 public:
  // All must outlive the gRPC server that serves this service; `sessions`
  // may be null (no sessions).
  // `replica` and `advertised_address` are what GetServerInfo reports
  // (server_info.h).
  MaterializerService(engine::Engine* engine, ThreadPool* workers,
                      const Authenticator* authenticator,
                      registry::SessionTable* sessions,
                      std::string replica = "",
                      std::string advertised_address = "");

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const v1::PlanRequest* request,
                                 v1::PlanResponse* response) override;
  grpc::ServerUnaryReactor* Materialize(
      grpc::CallbackServerContext* context,
      const v1::MaterializeRequest* request,
      v1::MaterializeResponse* response) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::HandleInfo* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchWeights(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* DescribeFile(grpc::CallbackServerContext* context,
                                         const v1::FetchRequest* request,
                                         v1::FileLayout* response) override;
  grpc::ServerUnaryReactor* ExportHandle(grpc::CallbackServerContext* context,
                                         const v1::ExportRequest* request,
                                         v1::ExportResponse* response) override;
  grpc::ServerUnaryReactor* CloseExport(
      grpc::CallbackServerContext* context,
      const v1::CloseExportRequest* request,
      v1::CloseExportResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* ListHandles(
      grpc::CallbackServerContext* context,
      const v1::ListHandlesRequest* request,
      v1::ListHandlesResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerBidiReactor<v1::AttachRequest, v1::AttachResponse>* Attach(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* context,
                                  const v1::RenewRequest* request,
                                  v1::RenewResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const v1::GetServerInfoRequest* request,
      v1::ServerInfo* response) override;

 private:
  // Authenticates, then runs `call(caller)` -> StatusOr<Response> inline or
  // on the worker pool, stores the value in *response and finishes.
  template <typename Response, typename Call>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context,
                                  Response* response, bool offload,
                                  Call call);

  engine::Engine* const engine_;
  ThreadPool* const workers_;
  const Authenticator* const authenticator_;
  registry::SessionTable* const sessions_;
  const std::string replica_;
  const std::string advertised_address_;
};

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_
