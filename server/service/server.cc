#include "server/service/server.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/thread_pool.h"
#include "server/common/units.h"
#include "server/engine/engine.h"
#include "server/memory/caching_allocator.h"
#include "server/memory/fake_gpu_driver.h"
#include "server/memory/gpu_driver.h"
#include "server/memory/gpu_report.h"
#include "server/memory/nvml_driver.h"
#include "server/memory/shm_file.h"
#include "server/metrics/metrics.h"
#include "server/metrics/metrics_server.h"
#include "server/metrics/session_reporter.h"
#include "server/registry/registry.h"
#include "server/registry/session.h"
#include "server/service/auth.h"
#include "server/service/credential_watcher.h"
#include "server/service/health_listener.h"
#include "server/service/materializer_service.h"
#include "server/service/server_info.h"

namespace materializer::service {

constexpr char kServiceName[] = "materializer.v1.Materializer";

namespace {

absl::StatusOr<memory::QuotaBook> LoadQuotas(const ServerOptions& options) {
  memory::Quota base;
  if (!options.default_quota_bytes.empty()) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(options.default_quota_bytes);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("default quota bytes: ", bytes.status().message()));
    }
    base.total_bytes = *bytes;
  }
  if (options.default_quota_handles > 0) {
    base.handles = static_cast<uint32_t>(options.default_quota_handles);
  }
  if (options.quota_file.empty()) return memory::QuotaBook(std::move(base));
  std::ifstream file(options.quota_file);
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the quota file ", options.quota_file));
  }
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<memory::QuotaBook> book =
      memory::QuotaBook::FromJson(text.str(), std::move(base));
  if (!book.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.quota_file, ": ", book.status().message()));
  }
  return book;
}

// The GPU driver the server watches: the fake a test asked for, else NVML
// if this host has it and the pool has a CUDA device, else none.
absl::StatusOr<std::unique_ptr<memory::GpuDriver>> OpenGpuDriver(
    const ServerOptions& options,
    const std::vector<memory::DeviceConfig>& devices) {
  if (!options.fake_gpu_driver_file.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<memory::FakeGpuDriver> fake,
                     memory::FakeGpuDriver::FromFile(
                         options.fake_gpu_driver_file));
    return std::unique_ptr<memory::GpuDriver>(std::move(fake));
  }
  if (std::none_of(devices.begin(), devices.end(),
                   [](const memory::DeviceConfig& d) {
                     return d.kind == memory::DeviceKind::kCuda;
                   })) {
    return std::unique_ptr<memory::GpuDriver>();
  }
  absl::StatusOr<std::unique_ptr<memory::GpuDriver>> nvml = memory::LoadNvml();
  if (!nvml.ok()) {
    MLOG(WARNING) << "GPU driver figures unavailable (" << nvml.status()
                  << "): admission uses the ledger alone and GetStats "
                     "reports no driver memory";
    return std::unique_ptr<memory::GpuDriver>();
  }
  return nvml;
}

// The most an adaptive shared-memory pool keeps: half of the smaller of
// the tmpfs and the host's memory (its cgroup limit when lower). Half,
// because a slab taken becomes an export (the pool and the exports share
// the tmpfs, they do not add up), while a default /dev/shm is itself half
// of RAM, so a quarter of it would not hold a model of an eighth of the
// host's memory; the learned size is what the exports used, and the pool
// also stays within the CPU capacity no client holds (CpuHeadroom).
uint64_t AdaptivePoolCap(uint64_t tmpfs_bytes) {
  uint64_t bytes = memory::HostMemoryBytes();
  if (tmpfs_bytes > 0 && tmpfs_bytes < bytes) bytes = tmpfs_bytes;
  return bytes / 2;
}

// The CPU devices' bytes that no client holds in the ledger: the room the
// shared-memory pool may use (its slabs are host memory).
std::function<uint64_t()> CpuHeadroom(const memory::DevicePool* pool) {
  return [pool] {
    uint64_t free = 0;
    const std::vector<memory::DeviceConfig>& devices = pool->devices();
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].kind == memory::DeviceKind::kCpu) {
        free += pool->FreeBytes(static_cast<int>(i));
      }
    }
    return free;
  };
}

}  // namespace

std::string Server::metrics_address() const {
  return metrics_server_ != nullptr ? metrics_server_->address() : "";
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Authenticator> authenticator,
                   Authenticator::Create(options.auth));
  if (authenticator->insecure() && !IsLoopbackAddress(options.listen) &&
      !options.allow_insecure_remote) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", options.listen,
        ": without TLS client authentication, client identity would come "
        "from unauthenticated metadata. Configure --tls_cert/--tls_key with "
        "--tls_client_ca or --token_file, listen on a loopback address, or "
        "pass --allow_insecure_remote where every peer that can reach the "
        "port is trusted"));
  }
  char hostname[256] = {};
  ::gethostname(hostname, sizeof(hostname) - 1);
  ASSIGN_OR_RETURN(std::string replica,
                   ReplicaNameFor(options.replica, options.advertise, hostname));
  ASSIGN_OR_RETURN(std::vector<memory::DeviceConfig> devices,
                   memory::ConfigureDevices(options.pool));
  ASSIGN_OR_RETURN(memory::QuotaBook quotas, LoadQuotas(options));
  absl::StatusOr<uint64_t> headroom = ParseBytes(options.gpu_free_headroom);
  if (!headroom.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu free headroom: ", headroom.status().message()));
  }

  std::unique_ptr<Server> server(new Server());
  ASSIGN_OR_RETURN(server->gpu_driver_, OpenGpuDriver(options, devices));
  if (server->gpu_driver_ != nullptr) {
    memory::GpuReporter::Options report;
    report.caching_allocator_bytes = [](const memory::DeviceConfig& device) {
      return device.kind == memory::DeviceKind::kCuda
                 ? memory::CachingAllocatorReservedBytes(device.ordinal)
                 : uint64_t{0};
    };
    server->gpu_reporter_ = std::make_unique<memory::GpuReporter>(
        server->gpu_driver_.get(), std::move(report));
  }
  ASSIGN_OR_RETURN(
      server->pool_,
      memory::DevicePool::Create(
          devices, std::move(quotas),
          memory::DriverAdmission{server->gpu_driver_.get(), *headroom}));
  server->replica_ = replica;
  server->registry_ = std::make_unique<registry::HandleRegistry>(replica);
  if (!options.checkpoint_roots.empty()) {
    absl::StatusOr<checkpoint::CheckpointRoots> roots =
        checkpoint::CheckpointRoots::Create(options.checkpoint_roots,
                                            options.checkpoint_readers);
    if (!roots.ok()) return roots.status();
    absl::StatusOr<uint64_t> cache_bytes =
        ParseBytes(options.checkpoint_cache_bytes);
    if (!cache_bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint_cache_bytes: ", cache_bytes.status().message()));
    }
    server->checkpoint_roots_ =
        std::make_unique<checkpoint::CheckpointRoots>(std::move(*roots));
    server->checkpoint_opener_ =
        std::make_unique<load::RootsOpener>(server->checkpoint_roots_.get());
    load::RangeCache::Options cache_options;
    cache_options.capacity_bytes = *cache_bytes;
    server->checkpoint_cache_ =
        std::make_shared<load::RangeCache>(cache_options);
  }
  const bool adaptive_pool = options.shm_pool_bytes == "auto";
  absl::StatusOr<uint64_t> shm_pool_bytes =
      adaptive_pool ? absl::StatusOr<uint64_t>(0)
                    : ParseBytes(options.shm_pool_bytes);
  if (!shm_pool_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm_pool_bytes: ", shm_pool_bytes.status().message(),
        " (a size, \"auto\" or 0)"));
  }
  // The default directory may be missing (a container without /dev/shm):
  // then only exports fail. One named on the command line must be usable.
  absl::StatusOr<memory::SharedMemoryDirInfo> shm_dir =
      memory::InspectSharedMemoryDir(options.shm_dir);
  if (!shm_dir.ok()) {
    if (options.shm_dir != ServerOptions().shm_dir) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shm_dir: ", shm_dir.status().message()));
    }
    MLOG(WARNING) << shm_dir.status().message()
                  << "; exportable CPU arenas will fail";
  } else if (shm_dir->huge_pages) {
    MLOG(INFO) << "shared memory in " << options.shm_dir << ": 2 MiB pages ("
               << shm_dir->mount_point << ", huge=" << shm_dir->huge << ")";
  } else {
    MLOG(INFO) << "shared memory in " << options.shm_dir << ": 4 KiB pages ("
               << shm_dir->mount_point << ", huge=" << shm_dir->huge
               << "); a tmpfs mounted with huge=within_size makes fresh "
                  "pages several times cheaper (docs/operations.md)";
  }
  memory::SharedMemoryPool::Options shm_pool_options;
  shm_pool_options.slab_bytes = uint64_t{128} << 20;
  if (adaptive_pool) {
    shm_pool_options.adaptive = true;
    shm_pool_options.target_bytes =
        shm_dir.ok() ? AdaptivePoolCap(shm_dir->capacity_bytes) : 0;
  } else {
    shm_pool_options.target_bytes = *shm_pool_bytes;
    if (shm_pool_options.target_bytes > 0 &&
        shm_pool_options.target_bytes < shm_pool_options.slab_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shm_pool_bytes: ", options.shm_pool_bytes,
          " is less than one slab (", FormatBytes(shm_pool_options.slab_bytes),
          "); use 0 for no pool"));
    }
  }
  if (shm_pool_options.target_bytes >= shm_pool_options.slab_bytes) {
    shm_pool_options.dir = options.shm_dir;
    shm_pool_options.quiet = options.shm_pool_quiet;
    shm_pool_options.release_after = options.shm_pool_release_after;
    shm_pool_options.headroom = CpuHeadroom(server->pool_.get());
    MLOG(INFO) << "shared-memory pool: "
               << (adaptive_pool ? "adaptive, up to " : "fixed, ")
               << FormatBytes(shm_pool_options.target_bytes)
               << " (within the CPU capacity no client holds)";
    server->shm_pool_ =
        std::make_shared<memory::SharedMemoryPool>(shm_pool_options);
  }
  metrics::StateSources sources;
  sources.pool = server->pool_.get();
  sources.registry = server->registry_.get();
  sources.gpu = server->gpu_reporter_.get();
  sources.client_labels = options.metrics_client_labels;
  if (server->checkpoint_cache_ != nullptr) {
    sources.checkpoint_cache = [cache = server->checkpoint_cache_] {
      const load::RangeCache::Stats stats = cache->stats();
      metrics::CheckpointCacheFigures figures;
      figures.capacity_bytes = stats.capacity_bytes;
      figures.cached_bytes = stats.cached_bytes;
      figures.read_bytes = stats.bytes_read_from_files;
      figures.served_bytes = stats.bytes_served_from_cache;
      figures.evicted_bytes = stats.evicted_bytes;
      return figures;
    };
  }
  if (server->shm_pool_ != nullptr) {
    sources.shm_pool = [pool = server->shm_pool_] {
      const memory::SharedMemoryPool::Stats stats = pool->stats();
      metrics::ShmPoolFigures figures;
      figures.target_bytes = stats.target_bytes;
      figures.max_bytes = stats.max_bytes;
      figures.bytes = stats.bytes;
      figures.taken_bytes = stats.taken_bytes_total;
      figures.filled_bytes = stats.filled_bytes_total;
      figures.trimmed_bytes = stats.trimmed_bytes_total;
      return figures;
    };
  }
  server->metrics_ = std::make_unique<metrics::Metrics>(sources);
  server->session_reporter_ =
      std::make_unique<metrics::SessionReporter>(server->metrics_.get());
  server->sessions_ = std::make_unique<registry::SessionTable>(
      server->registry_.get(), options.session_grace,
      server->session_reporter_.get());
  server->authenticator_ = std::move(authenticator);
  server->credential_watcher_ = std::make_unique<CredentialWatcher>(
      server->authenticator_->CredentialSources(),
      options.credential_check_interval, server->metrics_.get());
  if (options.client_workers < 0 || options.client_queue < 1) {
    return absl::InvalidArgumentError(
        "client workers must be >= 0 and the client queue >= 1");
  }
  ThreadPool::Options pool_options;
  pool_options.threads =
      options.workers > 0
          ? options.workers
          : std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
  pool_options.max_running_per_key = options.client_workers;
  pool_options.max_queued_per_key = static_cast<size_t>(options.client_queue);
  server->workers_ = std::make_unique<ThreadPool>(pool_options);
  const int workers = server->workers_->num_threads();
  engine::EngineOptions engine_options;
  engine_options.checkpoint_opener = server->checkpoint_opener_.get();
  engine_options.checkpoint_cache = server->checkpoint_cache_.get();
  engine_options.shm_pool = server->shm_pool_.get();
  engine_options.shm_dir = options.shm_dir;
  engine_options.sessions = server->sessions_.get();
  engine_options.default_ttl = options.default_ttl;
  engine_options.metrics = server->metrics_.get();
  engine_options.gpu = server->gpu_reporter_.get();
  // Hashing a handle's tensors is request work: no more threads than the
  // pool's, and no more than the machine has.
  engine_options.digest_threads = std::max(
      1,
      std::min(workers, static_cast<int>(std::thread::hardware_concurrency())));
  server->engine_ = std::make_unique<engine::Engine>(
      server->pool_.get(), server->registry_.get(), server->workers_.get(),
      engine_options);
  server->service_ = std::make_unique<MaterializerService>(
      server->engine_.get(), server->workers_.get(),
      server->authenticator_.get(), server->sessions_.get(),
      server->metrics_.get(), replica, options.advertise);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen,
                           server->authenticator_->ServerCredentials(),
                           &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive: the server pings an idle connection every 10 s and drops it
  // after 10 s without an answer, so a silently dead peer (and the session
  // it holds) is noticed within 20 s. Clients may ping as often as every
  // 5 s, even without calls in flight (an idle Attach stream is the
  // normal state of a lease), and are never cut off for pinging.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // gRPC binds with SO_REUSEPORT by default: a second materializerd started
  // on a busy port would come up and take a share of the new connections,
  // each with a ledger and handles of its own (clients would see their
  // handles answer NOT_FOUND at random). Starting must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->service_.get());
  server->grpc_server_ = builder.BuildAndStart();
  if (server->grpc_server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     " (address in use, or not an address of this host)"));
  }
  grpc::HealthCheckServiceInterface* health =
      server->grpc_server_->GetHealthCheckService();
  if (health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(kServiceName, true);
  }

  const std::string host =
      options.listen.substr(0, options.listen.rfind(':'));
  server->address_ = absl::StrCat(host, ":", server->port_);
  if (!options.health_listen.empty()) {
    ASSIGN_OR_RETURN(
        server->health_listener_,
        HealthListener::Start(options.health_listen, {"", kServiceName}));
    MLOG(INFO) << "health checks (plaintext, grpc.health.v1 only) on "
               << server->health_listener_->address();
  }
  if (!options.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(server->metrics_server_,
                     metrics::MetricsServer::Start(options.metrics_listen,
                                                   server->metrics_.get()));
    MLOG(INFO) << "metrics on http://" << server->metrics_server_->address()
               << "/metrics";
  }
  if (server->gpu_driver_ != nullptr) {
    MLOG(INFO) << "GPU memory as the driver sees it: "
               << server->gpu_driver_->Describe() << "; admission leaves "
               << FormatBytes(*headroom) << " of its free memory as headroom";
  }

  std::vector<std::string> summary;
  for (const memory::DeviceConfig& device : devices) {
    summary.push_back(
        absl::StrCat(device.name, " (", FormatBytes(device.capacity_bytes),
                     ")"));
  }
  MLOG(INFO) << "serving " << kServiceName << " on " << server->address_
             << " with devices " << absl::StrJoin(summary, ", ") << ", "
             << workers << " workers (at most "
             << server->workers_->max_running_per_key() << " per client)";
  if (!replica.empty()) {
    MLOG(INFO) << "replica \"" << replica << "\""
               << (options.advertise.empty()
                       ? std::string()
                       : absl::StrCat(", advertised as ", options.advertise))
               << ": handle ids end with @" << replica;
  }
  if (server->authenticator_->insecure()) {
    MLOG(WARNING) << server->authenticator_->Describe();
  } else {
    MLOG(INFO) << "authentication: " << server->authenticator_->Describe()
               << "; credential files are checked for changes "
               << (options.credential_check_interval > absl::ZeroDuration()
                       ? absl::StrCat("every ",
                                      absl::FormatDuration(
                                          options.credential_check_interval),
                                      " and ")
                       : std::string())
               << "on SIGHUP";
  }
  MLOG(INFO) << "sessions outlive their stream by "
             << absl::FormatDuration(options.session_grace)
             << "; handles outside a session are leased for "
             << absl::FormatDuration(options.default_ttl) << " by default";
  server->reaper_ = std::thread(
      [raw = server.get(), interval = options.reap_interval] {
        raw->ReapLoop(interval);
      });
  return server;
}

void Server::ReapLoop(absl::Duration interval) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_reaper_), interval)) {
        return;
      }
    }
    const absl::Time now = absl::Now();
    sessions_->Reap(now);  // each end is logged by the session reporter
    const absl::Time start = absl::Now();
    std::vector<std::string> expired = registry_->ReleaseExpired(now);
    if (!expired.empty()) {
      const absl::Duration cleanup = absl::Now() - start;
      metrics_->RecordLeaseExpiry(cleanup, expired.size());
      MLOG_EVENT(INFO, "lease_expired")
          .List("handles", expired)
          .Millis("cleanup_ms", cleanup);
    }
  }
}

Server::~Server() { Shutdown(absl::Seconds(5)); }

absl::Status Server::ReloadCredentials() {
  return credential_watcher_->ReloadNow();
}

std::string Server::health_address() const {
  return health_listener_ == nullptr ? "" : health_listener_->address();
}

void Server::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&shut_down_));
}

void Server::Shutdown(absl::Duration deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {  // another caller does the work; wait for it
      mu_.Await(absl::Condition(&shut_down_));
      return;
    }
    shutting_down_ = true;
  }
  // Null when Start failed half way.
  if (credential_watcher_ != nullptr) credential_watcher_->Stop();
  // Probes see the drain before the port stops taking calls.
  if (health_listener_ != nullptr) health_listener_->SetNotServing();
  // grpc_server_ is null when Start failed half way.
  if (grpc_server_ != nullptr) {
    if (grpc::HealthCheckServiceInterface* health =
            grpc_server_->GetHealthCheckService()) {
      health->Shutdown();
    }
    grpc_server_->Shutdown(
        std::chrono::system_clock::now() +
        std::chrono::microseconds(absl::ToInt64Microseconds(deadline)));
  }
  {
    absl::MutexLock lock(&mu_);
    stop_reaper_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  workers_.reset();  // finishes queued and async work
  if (health_listener_ != nullptr) health_listener_->Shutdown();
  if (grpc_server_ != nullptr) {
    MLOG(INFO) << "shut down";
  }
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

}  // namespace materializer::service
