#ifndef MATERIALIZER_SERVER_SERVICE_HEALTH_LISTENER_H_
#define MATERIALIZER_SERVER_SERVICE_HEALTH_LISTENER_H_

// A plaintext port that serves grpc.health.v1.Health and nothing else.
//
// Probes that cannot present a client certificate (the kubelet's gRPC
// probes, load balancer checks) cannot reach the health service of a port
// that requires mTLS. This listener answers them on a separate address,
// without TLS, and carries no other service (no Materializer, no
// reflection), so opening it reveals only whether the server is serving.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<HealthListener> health,
//                    HealthListener::Start("0.0.0.0:8081", {"", kService}));
//   ... health->SetNotServing();  // when a drain begins
//   health->Shutdown();

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace materializer::service {

// Health calls are served on gRPC's threads while the owner holds the
// listener; SetNotServing and Shutdown are the owner's, called from one
// thread at a time (service::Server calls them in its shutdown).
class HealthListener {
 public:
  // Listens on `address` (host:port; port 0 picks one) and reports every
  // name in `services` as SERVING. UNAVAILABLE if the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<HealthListener>> Start(
      const std::string& address, const std::vector<std::string>& services);

  ~HealthListener();
  HealthListener(const HealthListener&) = delete;
  HealthListener& operator=(const HealthListener&) = delete;

  // The bound address, e.g. "0.0.0.0:8081".
  const std::string& address() const { return address_; }

  // Every service answers NOT_SERVING from now on (a drain has begun);
  // watchers are told. Irreversible.
  void SetNotServing();

  // Closes the port. Idempotent; the destructor calls it.
  void Shutdown();

 private:
  HealthListener() = default;

  std::string address_;
  // Answers every other method; outlives server_.
  std::unique_ptr<grpc::CallbackGenericService> nothing_else_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_HEALTH_LISTENER_H_
