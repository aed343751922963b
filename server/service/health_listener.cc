#include "server/service/health_listener.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace materializer::service {

namespace {

// Drops the builder's plugins. Linking gRPC's reflection library registers
// a plugin that every ServerBuilder of the process picks up; on this port
// it would list the main server's services and serve its proto files.
class WithoutPlugins : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->clear();
  }
};

// Every method other than the health service's: UNIMPLEMENTED, saying
// where the service is. (It also gives the builder a callback service to
// start with; gRPC adds its health service only once the server starts.)
class NothingElse : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(const std::string& method) {
        Finish(grpc::Status(
            grpc::StatusCode::UNIMPLEMENTED,
            absl::StrCat(method,
                         ": this port serves only grpc.health.v1.Health; "
                         "other services are on the main (TLS) port")));
      }
      void OnDone() override { delete this; }
    };
    return new Reactor(context->method());
  }
};

// A health check request names a service (a short string); nothing larger
// needs to reach this port.
constexpr int kMaxMessageBytes = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<HealthListener>> HealthListener::Start(
    const std::string& address, const std::vector<std::string>& services) {
  // The health service is gRPC's default one, which the builder adds when
  // this process-wide switch is on (it already is when service::Server
  // started first).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetOption(std::make_unique<WithoutPlugins>());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // gRPC binds with SO_REUSEPORT by default, so a second process could
  // share the port and answer half the probes; the port is ours alone.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<HealthListener> listener(new HealthListener());
  listener->nothing_else_ = std::make_unique<NothingElse>();
  builder.RegisterCallbackGenericService(listener->nothing_else_.get());
  listener->server_ = builder.BuildAndStart();
  if (listener->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for health checks on ", address,
                     " (address in use, or not an address of this host)"));
  }
  grpc::HealthCheckServiceInterface* health =
      listener->server_->GetHealthCheckService();
  if (health == nullptr) {
    return absl::InternalError("gRPC did not create its health service");
  }
  for (const std::string& service : services) {
    health->SetServingStatus(service, true);
  }
  listener->address_ =
      absl::StrCat(address.substr(0, address.rfind(':')), ":", port);
  return listener;
}

HealthListener::~HealthListener() { Shutdown(); }

void HealthListener::SetNotServing() {
  if (server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health =
          server_->GetHealthCheckService()) {
    // Shutdown() of the health service (not of the server): every status
    // becomes NOT_SERVING and stays so.
    health->Shutdown();
  }
}

void HealthListener::Shutdown() {
  if (server_ == nullptr) return;
  SetNotServing();
  // Health calls are unary and short; streaming Watch calls are cancelled.
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
}

}  // namespace materializer::service
