#include "server/service/server.h"

#include <algorithm>
#include <fstream>
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
#include "server/registry/registry.h"
#include "server/registry/session.h"
#include "server/service/auth.h"
#include "server/service/materializer_service.h"

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

}  // namespace

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
  ASSIGN_OR_RETURN(std::vector<memory::DeviceConfig> devices,
                   memory::ConfigureDevices(options.pool));
  ASSIGN_OR_RETURN(memory::QuotaBook quotas, LoadQuotas(options));

  std::unique_ptr<Server> server(new Server());
  ASSIGN_OR_RETURN(server->pool_,
                   memory::DevicePool::Create(devices, std::move(quotas)));
  server->registry_ = std::make_unique<registry::HandleRegistry>();
  server->sessions_ = std::make_unique<registry::SessionTable>(
      server->registry_.get(), options.session_grace);
  server->authenticator_ = std::move(authenticator);
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
  engine_options.sessions = server->sessions_.get();
  engine_options.default_ttl = options.default_ttl;
  server->engine_ = std::make_unique<engine::Engine>(
      server->pool_.get(), server->registry_.get(), server->workers_.get(),
      engine_options);
  server->service_ = std::make_unique<MaterializerService>(
      server->engine_.get(), server->workers_.get(),
      server->authenticator_.get(), server->sessions_.get());

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
  if (server->authenticator_->insecure()) {
    MLOG(WARNING) << server->authenticator_->Describe();
  } else {
    MLOG(INFO) << "authentication: " << server->authenticator_->Describe();
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
    if (int ended = sessions_->Reap(now); ended > 0) {
      MLOG(INFO) << "ended " << ended
                 << " session(s) past their grace period";
    }
    for (const std::string& id : registry_->ReleaseExpired(now)) {
      MLOG(INFO) << "released " << id << ": its lease lapsed";
    }
  }
}

Server::~Server() { Shutdown(absl::Seconds(5)); }

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
  if (grpc_server_ != nullptr) {
    MLOG(INFO) << "shut down";
  }
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

}  // namespace materializer::service
