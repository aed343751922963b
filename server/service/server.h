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
#include "server/checkpoint/roots.h"
#include "server/load/checkpoint_files.h"
#include "server/load/range_cache.h"
#include "server/memory/device.h"
#include "server/memory/pool.h"
#include "server/memory/shm_pool.h"
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
namespace memory {
class GpuDriver;
class GpuReporter;
}
namespace metrics {
class Metrics;
class MetricsServer;
class SessionReporter;
}
namespace service {
class HealthListener;
class MaterializerService;

struct ServerOptions {
  // host:port; port 0 picks a free one (see Server::address()).
  std::string listen = "127.0.0.1:50051";
  // If set, a second, plaintext port that serves only grpc.health.v1
  // (health_listener.h), for probes that cannot do TLS.
  std::string health_listen;
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
  // How often the credential files (auth) are checked for changes, which
  // are put in force without a restart (credential_watcher.h); zero: only
  // when ReloadCredentials() is called.
  absl::Duration credential_check_interval = absl::Seconds(1);
  // How long a session outlives its Attach stream (0: release at once).
  absl::Duration session_grace = absl::Seconds(5);
  // Lease of handles created outside a session, when the request sets none.
  absl::Duration default_ttl = absl::Hours(1);
  // Scale-out (docs/architecture.md, "Scale-out"): the address clients
  // reach this replica at ("host:port"), and its name, which every handle
  // id it issues carries (server_info.h derives it from `advertise` when
  // empty). Both empty: a single server, ids as before.
  std::string advertise;
  std::string replica;
  // How often ended sessions and lapsed leases are reaped.
  absl::Duration reap_interval = absl::Milliseconds(200);
  // Observability (docs/operations.md). Prometheus metrics over HTTP on
  // this host:port (port 0 picks one); empty: not served.
  std::string metrics_listen;
  // Clients named in per-client metrics (the rest: "(other)").
  int metrics_client_labels = 20;
  // GPU memory admission leaves this much of the driver's free memory
  // alone (a size such as "256MiB").
  std::string gpu_free_headroom = "256MiB";
  // Testing: a fake GPU driver (memory/fake_gpu_driver.h file format)
  // instead of NVML, e.g. to stand behind virtual CPU devices.
  std::string fake_gpu_driver_file;
  // --checkpoint_roots, --checkpoint_readers (checkpoint/roots.h) and the
  // checkpoint cache's budget ("2GiB", "0"); no roots: no checkpoints.
  std::string checkpoint_roots;
  std::string checkpoint_readers;
  std::string checkpoint_cache_bytes = "2GiB";
  // Shared memory kept resident for exportable CPU arenas while idle
  // (memory/shm_pool.h): "auto" (adaptive: as much as the largest burst
  // of exports asked for, up to AdaptivePoolCap), a fixed size ("8GiB"),
  // or "0" (none); how long after the last Materialize its refill may
  // start; and how long an adaptive pool stays unused before it frees
  // everything.
  std::string shm_pool_bytes = "auto";
  absl::Duration shm_pool_quiet = absl::Seconds(1);
  absl::Duration shm_pool_release_after = absl::Minutes(15);
  // The tmpfs directory that exportable CPU arenas (and the pool's slabs)
  // are files in (memory/shm_file.h). One mounted with huge=within_size
  // gives them 2 MiB pages (docs/operations.md, "Shared memory").
  std::string shm_dir = "/dev/shm";
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
  // The replica name handle ids carry; "" for a single server.
  const std::string& replica() const { return replica_; }
  int port() const { return port_; }
  // The health listener's bound address; empty without health_listen.
  std::string health_address() const;
  // Where /metrics is served ("" when it is not).
  std::string metrics_address() const;

  // Reads the credential files now and puts what changed in force (main
  // calls it on SIGHUP). OK, or the first refusal; each outcome is logged.
  absl::Status ReloadCredentials();

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
  std::string replica_;
  int port_ = 0;
  // Declaration order is teardown order reversed: the gRPC server goes
  // first, then the workers (draining async work), then the engine and the
  // state it uses.
  // The GPU driver (NVML, a fake, or none) and its reporter come first:
  // the pool, the engine and the metrics read them until the end.
  std::unique_ptr<memory::GpuDriver> gpu_driver_;
  std::unique_ptr<memory::GpuReporter> gpu_reporter_;
  std::unique_ptr<memory::DevicePool> pool_;
  std::unique_ptr<registry::HandleRegistry> registry_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<metrics::SessionReporter> session_reporter_;
  std::unique_ptr<registry::SessionTable> sessions_;
  std::unique_ptr<Authenticator> authenticator_;
  // Uses the authenticator and the metrics; stopped first at shutdown.
  std::unique_ptr<CredentialWatcher> credential_watcher_;
  // Declared before the engine, which borrows them.
  std::unique_ptr<checkpoint::CheckpointRoots> checkpoint_roots_;
  std::unique_ptr<load::RootsOpener> checkpoint_opener_;
  // Shared with the metrics, which read it at each scrape.
  std::shared_ptr<load::RangeCache> checkpoint_cache_;
  std::shared_ptr<memory::SharedMemoryPool> shm_pool_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<ThreadPool> workers_;
  std::unique_ptr<MaterializerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // Goes NOT_SERVING when a shutdown begins, closes after the drain.
  std::unique_ptr<HealthListener> health_listener_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
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
