#ifndef MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_
#define MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_

// The gRPC adapter for materializer.v1.Materializer (callback API). Each
// handler authenticates, calls the engine, converts the status, and
// finishes; no business logic lives here.
//
// Threads: on gRPC's callback thread a handler only authenticates the call
// (a hash and a table scan) and queues it on the worker pool under the
// caller's identity, so clients are served fairly (common/thread_pool.h).
// Everything else, parsing the request included, runs on a worker. A call
// whose client has gone away (cancelled, or its deadline passed) before a
// worker takes it is not run at all; long calls poll for it while they run.
//
// Every method is a raw (ByteBuffer) method: requests are parsed here, so
// bytes that do not parse are INVALID_ARGUMENT naming the message type
// (gRPC's typed handlers would answer UNIMPLEMENTED with no message), and
// fetch chunks are written as serialized messages whose bytes reference
// the arena (fetch_reactor.h).

#include <string>

#include "materializer/v1/materializer.grpc.pb.h"
#include "server/common/thread_pool.h"
#include "server/engine/engine.h"
#include "server/metrics/metrics.h"
#include "server/registry/session.h"
#include "server/service/auth.h"

namespace materializer::service {

namespace internal {

// Layers<Base, A, B, C>::type is A<B<C<Base>>>: how gRPC's generated
// per-method mixins stack.
template <typename Base, template <typename> class... Mixins>
struct Layers {
  using type = Base;
};
template <typename Base, template <typename> class First,
          template <typename> class... Rest>
struct Layers<Base, First, Rest...> {
  using type = First<typename Layers<Base, Rest...>::type>;
};

}  // namespace internal

// Materializer with every method taking and answering raw bytes.
using RawMaterializerService = internal::Layers<
    v1::Materializer::Service,
    v1::Materializer::WithRawCallbackMethod_Plan,
    v1::Materializer::WithRawCallbackMethod_Materialize,
    v1::Materializer::WithRawCallbackMethod_Describe,
    v1::Materializer::WithRawCallbackMethod_FetchWeights,
    v1::Materializer::WithRawCallbackMethod_Release,
    v1::Materializer::WithRawCallbackMethod_ListHandles,
    v1::Materializer::WithRawCallbackMethod_GetStats,
    v1::Materializer::WithRawCallbackMethod_DescribeFile,
    v1::Materializer::WithRawCallbackMethod_Attach,
    v1::Materializer::WithRawCallbackMethod_Renew,
    v1::Materializer::WithRawCallbackMethod_ExportHandle,
    v1::Materializer::WithRawCallbackMethod_CloseExport,
    v1::Materializer::WithRawCallbackMethod_GetServerInfo,
    v1::Materializer::WithRawCallbackMethod_InspectCheckpoint>::type;

// Thread-safe. The engine, worker pool, authenticator, sessions and
// metrics must outlive the gRPC server that serves this service. Every
// call is logged and counted through a CallObserver (call_observer.h).
class MaterializerService final : public RawMaterializerService {
 public:
  // `sessions` may be null (no sessions), and `metrics` (calls are then
  // only logged). `replica` and `advertised_address` are what GetServerInfo
  // reports (server_info.h).
  MaterializerService(engine::Engine* engine, ThreadPool* workers,
                      const Authenticator* authenticator,
                      registry::SessionTable* sessions,
                      metrics::Metrics* metrics = nullptr,
                      std::string replica = "",
                      std::string advertised_address = "");

  using Reactor = grpc::ServerUnaryReactor;
  using Raw = grpc::ByteBuffer;

  Reactor* Plan(grpc::CallbackServerContext* context, const Raw* request,
                Raw* response) override;
  Reactor* Materialize(grpc::CallbackServerContext* context, const Raw* request,
                       Raw* response) override;
  Reactor* Describe(grpc::CallbackServerContext* context, const Raw* request,
                    Raw* response) override;
  grpc::ServerWriteReactor<Raw>* FetchWeights(
      grpc::CallbackServerContext* context, const Raw* request) override;
  Reactor* DescribeFile(grpc::CallbackServerContext* context,
                        const Raw* request, Raw* response) override;
  Reactor* ExportHandle(grpc::CallbackServerContext* context,
                        const Raw* request, Raw* response) override;
  Reactor* CloseExport(grpc::CallbackServerContext* context, const Raw* request,
                       Raw* response) override;
  Reactor* Release(grpc::CallbackServerContext* context, const Raw* request,
                   Raw* response) override;
  Reactor* ListHandles(grpc::CallbackServerContext* context, const Raw* request,
                       Raw* response) override;
  Reactor* GetStats(grpc::CallbackServerContext* context, const Raw* request,
                    Raw* response) override;
  grpc::ServerBidiReactor<Raw, Raw>* Attach(
      grpc::CallbackServerContext* context) override;
  Reactor* Renew(grpc::CallbackServerContext* context, const Raw* request,
                 Raw* response) override;
  Reactor* GetServerInfo(grpc::CallbackServerContext* context,
                         const Raw* request, Raw* response) override;
  Reactor* InspectCheckpoint(grpc::CallbackServerContext* context,
                             const Raw* request, Raw* response) override;

 private:
  // Authenticates, then queues on the worker pool: parse the request as
  // `Request`, run `call(caller, request, cancelled)` ->
  // StatusOr<Response>, serialize the answer into *response and finish.
  template <typename Request, typename Call>
  Reactor* Unary(const char* method, grpc::CallbackServerContext* context,
                 const Raw* request, Raw* response, Call call);

  engine::Engine* const engine_;
  ThreadPool* const workers_;
  const Authenticator* const authenticator_;
  registry::SessionTable* const sessions_;
  metrics::Metrics* const metrics_;
  const std::string replica_;
  const std::string advertised_address_;
};

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_MATERIALIZER_SERVICE_H_
