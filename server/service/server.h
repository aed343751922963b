#ifndef MATERIALIZER_SERVER_SERVICE_SERVER_H_
#define MATERIALIZER_SERVER_SERVICE_SERVER_H_

// A running materializerd: device pool, registry, engine, gRPC server.
// main() parses flags and calls Start; tests start the same thing on port 0.
//
//   ServerOptions options;
//   options.listen = "127.0.0.1:0";
//   ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(options));
//   Connect to server->address() ...
//   server->Shutdown(absl::Seconds(5));

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/memory/device.h"
#include "server/memory/pool.h"
#include "server/service/auth.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace materializer {
class ThreadPool;
namespace engine {
class Engine;
}
namespace registry {
class HandleRegistry;
class SessionTable;
}
namespace service {
class MaterializerService;

struct ServerOptions {
  // host:port; port 0 picks a free one (see Server::address()).
  std::string listen = "127.0.0.1:50051";
  memory::PoolOptions pool;
  // Per-client quotas: a JSON file (format in server/memory/quota.h), and
  // the default for clients it does not list (or for everyone, without a
  // file). Empty means no limit.
  std::string quota_file;
  std::string default_quota_bytes;
  int default_quota_handles = 0;
  // Largest request or response message.
  int max_message_bytes = 256 << 20;
  // Threads for every call's work (request parsing, Plan, Materialize,
  // fetch chunks, ...) and async materializations; 0 means one per
  // hardware thread, at least 4.
  int workers = 0;
  // Most workers one client's calls may hold at once; 0 means workers - 1,
  // so another client always finds a worker within one call's time.
  int client_workers = 0;
  // Most calls of one client waiting for a worker; more are refused with
  // RESOURCE_EXHAUSTED.
  int client_queue = 256;
  // Authentication (TLS with client certificates and/or bearer tokens, or
  // the development mode). The development mode takes the client's name
  // from metadata, which is safe only where every peer is trusted; serving
  // it on a non-loopback address must be asked for explicitly.
  AuthOptions auth;
  bool allow_insecure_remote = false;
  // How long a session outlives its Attach stream (0: release at once).
  absl::Duration session_grace = absl::Seconds(5);
  // Lease of handles created outside a session, when the request sets none.
  absl::Duration default_ttl = absl::Hours(1);
  // How often ended sessions and lapsed leases are reaped.
  absl::Duration reap_interval = absl::Milliseconds(200);
};

// Thread-safe.
class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options);

  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound address, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  memory::DevicePool& pool() { return *pool_; }
  registry::HandleRegistry& registry() { return *registry_; }

  // Blocks until Shutdown() has completed.
  void Wait();

  // Stops accepting calls, gives calls in flight until `deadline` to finish
  // (then cancels them), and drains background work. Idempotent.
  void Shutdown(absl::Duration deadline);

 private:
  Server() = default;

  std::string address_;
  int port_ = 0;
  // Declaration order is teardown order reversed: the gRPC server goes
  // first, then the workers (draining async work), then the engine and the
  // state it uses.
  std::unique_ptr<memory::DevicePool> pool_;
  std::unique_ptr<registry::HandleRegistry> registry_;
  std::unique_ptr<registry::SessionTable> sessions_;
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<ThreadPool> workers_;
  std::unique_ptr<MaterializerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Releases handles of ended sessions and lapsed leases.
  std::thread reaper_;

  void ReapLoop(absl::Duration interval);

  absl::Mutex mu_;
  // Guards the flags: a shutdown began / completed, the reaper must stop.
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_reaper_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace service
}  // namespace materializer

#endif  // MATERIALIZER_SERVER_SERVICE_SERVER_H_
