#include "server/metrics/metrics.h"

#include <array>
#include <atomic>
#include <deque>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "materializer/v1/materializer.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/memory/gpu_report.h"
#include "server/memory/pool.h"
#include "server/metrics/client_series.h"
#include "server/registry/registry.h"

namespace materializer::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Seconds, from 100 us (a GetStats) to 5 min (a large torch-mode init).
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60,
      120,    300};
  return *buckets;
}

// Bytes per second, 10 MB/s to 100 GB/s.
const Histogram::BucketBoundaries& ThroughputBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      1e7, 3e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11};
  return *buckets;
}

constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED

// Materialize phases, in PhaseTimings order.
constexpr const char* kPhases[] = {"validate", "plan",     "reserve", "allocate",
                                   "init",     "register", "total"};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }
double MicrosToSeconds(uint64_t us) { return static_cast<double>(us) / 1e6; }

// Families assembled at scrape time. References to families stay valid
// while more are added.
class Snapshot {
 public:
  MetricFamily& Family(std::string name, std::string help, MetricType type) {
    families_.push_back(MetricFamily{std::move(name), std::move(help), type,
                                     {}});
    return families_.back();
  }
  static void Add(MetricFamily& family, std::vector<ClientMetric::Label> labels,
                  double value) {
    ClientMetric metric;
    metric.label = std::move(labels);
    if (family.type == MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family.metric.push_back(std::move(metric));
  }
  std::vector<MetricFamily> Take() {
    return {std::make_move_iterator(families_.begin()),
            std::make_move_iterator(families_.end())};
  }

 private:
  std::deque<MetricFamily> families_;
};

}  // namespace

class Metrics::Impl final : public prometheus::Collectable {
 public:
  explicit Impl(StateSources sources)
      : sources_(sources),
        registry_(std::make_shared<prometheus::Registry>()),
        rpcs_(prometheus::BuildCounter()
                  .Name("materializer_rpcs_total")
                  .Help("Finished RPCs by method and status code")
                  .Register(*registry_)),
        rpc_seconds_(prometheus::BuildHistogram()
                         .Name("materializer_rpc_duration_seconds")
                         .Help("RPC latency by method, from the handler's "
                               "start to its status (streams: their whole "
                               "life)")
                         .Register(*registry_)),
        phase_seconds_(prometheus::BuildHistogram()
                           .Name("materializer_materialize_phase_seconds")
                           .Help("Duration of each phase of a "
                                 "materialization (sync and async)")
                           .Register(*registry_)),
        init_bytes_(prometheus::BuildCounter()
                        .Name("materializer_init_bytes_total")
                        .Help("Tensor bytes initialized, by RNG mode")
                        .Register(*registry_)),
        init_seconds_(prometheus::BuildCounter()
                          .Name("materializer_init_seconds_total")
                          .Help("Time spent initializing, by RNG mode "
                                "(bytes_total / seconds_total = bytes/s)")
                          .Register(*registry_)),
        init_rate_(prometheus::BuildHistogram()
                       .Name("materializer_init_bytes_per_second")
                       .Help("Init throughput of each materialization, by "
                             "RNG mode")
                       .Register(*registry_)),
        fetches_(prometheus::BuildCounter()
                     .Name("materializer_fetches_total")
                     .Help("Fetch streams opened: kind start (offset 0) or "
                           "resume (a later offset)")
                     .Register(*registry_)),
        fetch_bytes_(prometheus::BuildCounter()
                         .Name("materializer_fetch_bytes_total")
                         .Help("Bytes sent by fetch streams")
                         .Register(*registry_)
                         .Add({})),
        exports_opened_(prometheus::BuildCounter()
                            .Name("materializer_exports_opened_total")
                            .Help("Exports opened, by kind (shared_memory, "
                                  "cuda_ipc)")
                            .Register(*registry_)),
        exports_closed_(prometheus::BuildCounter()
                            .Name("materializer_exports_closed_total")
                            .Help("Exports closed")
                            .Register(*registry_)
                            .Add({})),
        sessions_opened_(prometheus::BuildCounter()
                             .Name("materializer_sessions_opened_total")
                             .Help("Sessions opened (new Attach streams "
                                   "without a resume token)")
                             .Register(*registry_)
                             .Add({})),
        sessions_resumed_(prometheus::BuildCounter()
                              .Name("materializer_sessions_resumed_total")
                              .Help("Sessions resumed within their grace "
                                    "period")
                              .Register(*registry_)
                              .Add({})),
        sessions_expired_(prometheus::BuildCounter()
                              .Name("materializer_sessions_expired_total")
                              .Help("Sessions ended after their grace period, "
                                    "their handles released")
                              .Register(*registry_)
                              .Add({})),
        sessions_live_(prometheus::BuildGauge()
                           .Name("materializer_sessions")
                           .Help("Live sessions (attached or in grace)")
                           .Register(*registry_)
                           .Add({})),
        cleanup_seconds_(prometheus::BuildHistogram()
                             .Name("materializer_cleanup_seconds")
                             .Help("Time to release the handles of an ended "
                                   "session or of lapsed leases, by reason")
                             .Register(*registry_)),
        cleanup_handles_(prometheus::BuildCounter()
                             .Name("materializer_cleanup_handles_total")
                             .Help("Handles released by cleanup, by reason "
                                   "(session_end, lease_expiry)")
                             .Register(*registry_)),
        credential_reloads_(
            prometheus::BuildCounter()
                .Name("materializer_credential_reloads_total")
                .Help("Changed credential files put in force (result ok) or "
                      "refused, the old ones staying (result error), by kind "
                      "(tokens, certificate, client_ca)")
                .Register(*registry_)),
        release_delay_(prometheus::BuildHistogram()
                           .Name("materializer_session_release_delay_seconds")
                           .Help("From the end of a session's stream to the "
                                 "release of its handles (grace period plus "
                                 "reaper delay)")
                           .Register(*registry_)
                           .Add({}, LatencyBuckets())) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> families = registry_->Collect();
    std::vector<MetricFamily> state = CollectState();
    families.insert(families.end(), std::make_move_iterator(state.begin()),
                    std::make_move_iterator(state.end()));
    return families;
  }

  void RecordRpc(absl::string_view method, absl::StatusCode code,
                 absl::Duration latency) {
    MethodInstruments& m = Method(method);
    const int index = static_cast<int>(code);
    if (index >= 0 && index < kNumCodes) {
      Counter* counter = m.by_code[index].load(std::memory_order_acquire);
      if (counter == nullptr) {
        // Family::Add is idempotent and locked; a race stores the same
        // pointer twice.
        counter = &rpcs_.Add({{"method", std::string(method)},
                              {"code", absl::StatusCodeToString(code)}});
        m.by_code[index].store(counter, std::memory_order_release);
      }
      counter->Increment();
    }
    m.latency->Observe(Seconds(latency));
  }

  void RecordMaterialize(const v1::PhaseTimings& t, absl::string_view rng,
                         uint64_t tensor_bytes) {
    const uint64_t phase_us[] = {t.validate_us(), t.plan_us(),
                                 t.reserve_us(),  t.allocate_us(),
                                 t.init_us(),     t.register_us(),
                                 t.total_us()};
    for (size_t i = 0; i < phase_.size(); ++i) {
      phase_[i]->Observe(MicrosToSeconds(phase_us[i]));
    }
    RngInstruments& r = Rng(rng);
    r.bytes->Increment(static_cast<double>(tensor_bytes));
    r.seconds->Increment(MicrosToSeconds(t.init_us()));
    if (t.init_us() > 0 && tensor_bytes > 0) {
      r.rate->Observe(static_cast<double>(tensor_bytes) /
                      MicrosToSeconds(t.init_us()));
    }
  }

  void RecordFetchStart(bool resumed) {
    Counter& c = resumed ? *fetch_resume_ : *fetch_start_;
    c.Increment();
  }
  void AddFetchBytes(uint64_t bytes) {
    fetch_bytes_.Increment(static_cast<double>(bytes));
  }
  void RecordExportOpened(absl::string_view kind) {
    exports_opened_.Add({{"kind", std::string(kind)}}).Increment();
  }
  void RecordExportClosed() { exports_closed_.Increment(); }

  void RecordSessionOpened(bool resumed) {
    if (resumed) {
      sessions_resumed_.Increment();
    } else {
      sessions_opened_.Increment();
      sessions_live_.Increment();
    }
  }
  void RecordSessionEnded(absl::Duration cleanup, absl::Duration since_detach,
                          size_t handles) {
    sessions_expired_.Increment();
    sessions_live_.Decrement();
    cleanup_session_->Observe(Seconds(cleanup));
    cleanup_session_handles_->Increment(static_cast<double>(handles));
    release_delay_.Observe(Seconds(since_detach));
  }
  void RecordLeaseExpiry(absl::Duration cleanup, size_t handles) {
    cleanup_lease_->Observe(Seconds(cleanup));
    cleanup_lease_handles_->Increment(static_cast<double>(handles));
  }

  void RecordCredentialReload(absl::string_view kind, bool ok) {
    // Rare: Family::Add (locked, idempotent) finds the series each time.
    credential_reloads_
        .Add({{"kind", std::string(kind)}, {"result", ok ? "ok" : "error"}})
        .Increment();
  }

  void InitFixedSeries() {
    for (const char* kind : {"tokens", "certificate", "client_ca"}) {
      for (const char* result : {"ok", "error"}) {
        credential_reloads_.Add({{"kind", kind}, {"result", result}});
      }
    }
    fetch_start_ = &fetches_.Add({{"kind", "start"}});
    fetch_resume_ = &fetches_.Add({{"kind", "resume"}});
    cleanup_session_ =
        &cleanup_seconds_.Add({{"reason", "session_end"}}, LatencyBuckets());
    cleanup_lease_ =
        &cleanup_seconds_.Add({{"reason", "lease_expiry"}}, LatencyBuckets());
    cleanup_session_handles_ = &cleanup_handles_.Add({{"reason", "session_end"}});
    cleanup_lease_handles_ = &cleanup_handles_.Add({{"reason", "lease_expiry"}});
    for (size_t i = 0; i < phase_.size(); ++i) {
      phase_[i] = &phase_seconds_.Add({{"phase", kPhases[i]}}, LatencyBuckets());
    }
  }

 private:
  struct MethodInstruments {
    Histogram* latency = nullptr;
    std::array<std::atomic<Counter*>, kNumCodes> by_code{};
  };
  struct RngInstruments {
    Counter* bytes = nullptr;
    Counter* seconds = nullptr;
    Histogram* rate = nullptr;
  };

  MethodInstruments& Method(absl::string_view method) {
    {
      absl::ReaderMutexLock lock(&mu_);
      if (auto it = methods_.find(method); it != methods_.end()) {
        return *it->second;
      }
    }
    absl::MutexLock lock(&mu_);
    auto& slot = methods_[std::string(method)];
    if (slot == nullptr) {
      slot = std::make_unique<MethodInstruments>();
      slot->latency = &rpc_seconds_.Add({{"method", std::string(method)}},
                                        LatencyBuckets());
    }
    return *slot;
  }

  RngInstruments& Rng(absl::string_view rng) {
    absl::MutexLock lock(&mu_);
    auto& slot = rngs_[std::string(rng)];
    if (slot.bytes == nullptr) {
      const std::string mode(rng);
      slot.bytes = &init_bytes_.Add({{"rng", mode}});
      slot.seconds = &init_seconds_.Add({{"rng", mode}});
      slot.rate = &init_rate_.Add({{"rng", mode}}, ThroughputBuckets());
    }
    return slot;
  }

  std::vector<MetricFamily> CollectState() const;

  const StateSources sources_;
  std::shared_ptr<prometheus::Registry> registry_;
  Family<Counter>& rpcs_;
  Family<Histogram>& rpc_seconds_;
  Family<Histogram>& phase_seconds_;
  Family<Counter>& init_bytes_;
  Family<Counter>& init_seconds_;
  Family<Histogram>& init_rate_;
  Family<Counter>& fetches_;
  Counter& fetch_bytes_;
  Family<Counter>& exports_opened_;
  Counter& exports_closed_;
  Counter& sessions_opened_;
  Counter& sessions_resumed_;
  Counter& sessions_expired_;
  Gauge& sessions_live_;
  Family<Histogram>& cleanup_seconds_;
  Family<Counter>& cleanup_handles_;
  Family<Counter>& credential_reloads_;
  Histogram& release_delay_;
  // Series that always exist, made once (InitFixedSeries).
  Counter* fetch_start_ = nullptr;
  Counter* fetch_resume_ = nullptr;
  Histogram* cleanup_session_ = nullptr;
  Histogram* cleanup_lease_ = nullptr;
  Counter* cleanup_session_handles_ = nullptr;
  Counter* cleanup_lease_handles_ = nullptr;
  std::array<Histogram*, 7> phase_{};  // in kPhases order

  absl::Mutex mu_;
  // Guards the maps (the instruments they point to are thread-safe).
  absl::flat_hash_map<std::string, std::unique_ptr<MethodInstruments>>
      methods_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RngInstruments> rngs_ ABSL_GUARDED_BY(mu_);
};

std::vector<MetricFamily> Metrics::Impl::CollectState() const {
  Snapshot out;
  using L = std::vector<ClientMetric::Label>;
  if (sources_.checkpoint_cache) {
    const CheckpointCacheFigures cache = sources_.checkpoint_cache();
    Snapshot::Add(out.Family("materializer_checkpoint_cache_capacity_bytes",
                             "Budget of the checkpoint cache "
                             "(--checkpoint_cache_bytes)",
                             MetricType::Gauge),
                  {}, static_cast<double>(cache.capacity_bytes));
    Snapshot::Add(out.Family("materializer_checkpoint_cache_bytes",
                             "Checkpoint bytes kept in the cache",
                             MetricType::Gauge),
                  {}, static_cast<double>(cache.cached_bytes));
    Snapshot::Add(out.Family("materializer_checkpoint_read_bytes_total",
                             "Checkpoint bytes read from files",
                             MetricType::Counter),
                  {}, static_cast<double>(cache.read_bytes));
    Snapshot::Add(out.Family("materializer_checkpoint_cache_served_bytes_total",
                             "Checkpoint bytes a load found in the cache "
                             "instead of reading them",
                             MetricType::Counter),
                  {}, static_cast<double>(cache.served_bytes));
    Snapshot::Add(out.Family("materializer_checkpoint_cache_evicted_bytes_total",
                             "Checkpoint bytes dropped from the cache to stay "
                             "within its budget",
                             MetricType::Counter),
                  {}, static_cast<double>(cache.evicted_bytes));
  }
  if (sources_.shm_pool) {
    const ShmPoolFigures pool = sources_.shm_pool();
    Snapshot::Add(out.Family("materializer_shm_pool_target_bytes",
                             "Shared memory the pool keeps resident when the "
                             "server is idle (adaptive: learned from the "
                             "largest burst of exports)",
                             MetricType::Gauge),
                  {}, static_cast<double>(pool.target_bytes));
    Snapshot::Add(out.Family("materializer_shm_pool_max_bytes",
                             "The most the shared-memory pool may keep "
                             "(--shm_pool_bytes)",
                             MetricType::Gauge),
                  {}, static_cast<double>(pool.max_bytes));
    Snapshot::Add(out.Family("materializer_shm_pool_bytes",
                             "Resident shared memory in the pool now",
                             MetricType::Gauge),
                  {}, static_cast<double>(pool.bytes));
    Snapshot::Add(out.Family("materializer_shm_pool_taken_bytes_total",
                             "Pool bytes handed to exportable arenas",
                             MetricType::Counter),
                  {}, static_cast<double>(pool.taken_bytes));
    Snapshot::Add(out.Family("materializer_shm_pool_filled_bytes_total",
                             "Shared memory the pool made resident",
                             MetricType::Counter),
                  {}, static_cast<double>(pool.filled_bytes));
    Snapshot::Add(out.Family("materializer_shm_pool_trimmed_bytes_total",
                             "Pool bytes freed unused: to make room for a "
                             "reservation, or after --shm_pool_release_after "
                             "without exports",
                             MetricType::Counter),
                  {}, static_cast<double>(pool.trimmed_bytes));
  }
  if (sources_.pool != nullptr) {
    const memory::PoolSnapshot snapshot = sources_.pool->Snapshot();
    auto& capacity = out.Family("materializer_device_capacity_bytes",
                                "Bytes the pool may hand out on the device",
                                MetricType::Gauge);
    auto& reserved = out.Family("materializer_device_reserved_bytes",
                                "Bytes admitted but not yet allocated",
                                MetricType::Gauge);
    auto& in_use = out.Family("materializer_device_in_use_bytes",
                              "Bytes held by arenas", MetricType::Gauge);
    auto& peak = out.Family("materializer_device_peak_bytes",
                            "Highest reserved + in-use + handed-over bytes since start",
                            MetricType::Gauge);
    auto& handed_over = out.Family(
        "materializer_device_handed_over_bytes",
        "Bytes of released handles still mapped by the processes they were "
        "handed over to (counted against capacity and quotas)",
        MetricType::Gauge);
    auto& handles = out.Family("materializer_device_handles",
                               "Handles counted on the device (reservations "
                               "and arenas)",
                               MetricType::Gauge);
    for (const memory::DeviceUsage& d : snapshot.devices) {
      const L labels = {{"device", d.device.name}};
      Snapshot::Add(capacity, labels,
                    static_cast<double>(d.device.capacity_bytes));
      Snapshot::Add(reserved, labels,
                    static_cast<double>(d.usage.reserved_bytes));
      Snapshot::Add(in_use, labels, static_cast<double>(d.usage.in_use_bytes));
      Snapshot::Add(peak, labels, static_cast<double>(d.usage.peak_bytes));
      Snapshot::Add(handed_over, labels,
                    static_cast<double>(d.usage.handed_over_bytes));
      Snapshot::Add(handles, labels, d.usage.handles);
    }

    std::vector<ClientFigures> clients;
    for (const auto& [name, usage] : snapshot.clients) {
      clients.push_back({name, usage.total.reserved_bytes,
                         usage.total.in_use_bytes, usage.total.handles});
    }
    Snapshot::Add(out.Family("materializer_clients",
                             "Clients holding bytes or handles",
                             MetricType::Gauge),
                  {}, static_cast<double>(clients.size()));
    auto& c_reserved = out.Family(
        "materializer_client_reserved_bytes",
        "Bytes a client has admitted but not yet allocated (top clients by "
        "bytes; the rest under client=\"(other)\")",
        MetricType::Gauge);
    auto& c_in_use = out.Family(
        "materializer_client_in_use_bytes",
        "Bytes of a client's arenas (top clients by bytes; the rest under "
        "client=\"(other)\")",
        MetricType::Gauge);
    auto& c_handles = out.Family(
        "materializer_client_handles",
        "Handles a client holds (top clients by bytes; the rest under "
        "client=\"(other)\")",
        MetricType::Gauge);
    for (const ClientFigures& c :
         BoundClientSeries(std::move(clients), sources_.client_labels)) {
      const L labels = {{"client", c.client}};
      Snapshot::Add(c_reserved, labels, static_cast<double>(c.reserved_bytes));
      Snapshot::Add(c_in_use, labels, static_cast<double>(c.in_use_bytes));
      Snapshot::Add(c_handles, labels, c.handles);
    }

    if (sources_.gpu != nullptr) {
      auto& info = out.Family("materializer_gpu_info",
                              "The GPU behind a pool device (always 1)",
                              MetricType::Gauge);
      auto& up = out.Family("materializer_gpu_driver_up",
                            "1 if the GPU driver answered this scrape",
                            MetricType::Gauge);
      auto& total = out.Family("materializer_gpu_total_bytes",
                               "Device memory, as the driver reports it",
                               MetricType::Gauge);
      auto& used = out.Family("materializer_gpu_used_bytes",
                              "Device memory in use by anyone, per the driver",
                              MetricType::Gauge);
      auto& free_bytes = out.Family("materializer_gpu_free_bytes",
                              "Device memory free, per the driver",
                              MetricType::Gauge);
      auto& server = out.Family(
          "materializer_gpu_server_process_bytes",
          "Device memory the driver charges to this server's process",
          MetricType::Gauge);
      auto& caching = out.Family(
          "materializer_gpu_caching_allocator_bytes",
          "Of that, bytes LibTorch's caching allocator has reserved",
          MetricType::Gauge);
      auto& others = out.Family(
          "materializer_gpu_other_processes",
          "Other processes holding device memory, by state (running, "
          "defunct, gone)",
          MetricType::Gauge);
      auto& other_bytes = out.Family(
          "materializer_gpu_other_process_bytes",
          "Device memory held by other processes, by their state",
          MetricType::Gauge);
      for (const memory::DeviceUsage& d : snapshot.devices) {
        if (!sources_.gpu->Covers(d.device)) continue;
        const std::string& device = d.device.name;
        absl::StatusOr<memory::DriverReport> report =
            sources_.gpu->Report(d.device);
        Snapshot::Add(up, {{"device", device}}, report.ok() ? 1 : 0);
        if (!report.ok()) continue;
        Snapshot::Add(info,
                      {{"device", device},
                       {"uuid", report->uuid},
                       {"name", report->name}},
                      1);
        const L labels = {{"device", device}};
        Snapshot::Add(total, labels, static_cast<double>(report->total_bytes));
        Snapshot::Add(used, labels, static_cast<double>(report->used_bytes));
        Snapshot::Add(free_bytes, labels,
                      static_cast<double>(report->free_bytes));
        Snapshot::Add(server, labels,
                      static_cast<double>(report->server_process_bytes));
        Snapshot::Add(caching, labels,
                      static_cast<double>(report->caching_allocator_bytes));
        for (memory::ProcessState state :
             {memory::ProcessState::kRunning, memory::ProcessState::kDefunct,
              memory::ProcessState::kGone}) {
          double count = 0;
          double bytes = 0;
          for (const memory::GpuProcessReport& p : report->other_processes) {
            if (p.state != state) continue;
            count += 1;
            bytes += static_cast<double>(p.used_bytes);
          }
          const L by_state = {{"device", device},
                              {"state", memory::ProcessStateName(state)}};
          Snapshot::Add(others, by_state, count);
          Snapshot::Add(other_bytes, by_state, bytes);
        }
      }
    }
  }
  if (sources_.registry != nullptr) {
    const registry::RegistryCensus census = sources_.registry->Census();
    auto& handles = out.Family("materializer_handles",
                               "Registered handles by state",
                               MetricType::Gauge);
    Snapshot::Add(handles, {{"state", "materializing"}},
                  static_cast<double>(census.materializing));
    Snapshot::Add(handles, {{"state", "ready"}},
                  static_cast<double>(census.ready));
    Snapshot::Add(handles, {{"state", "failed"}},
                  static_cast<double>(census.failed));
    Snapshot::Add(out.Family("materializer_exports_open",
                             "Exports open now", MetricType::Gauge),
                  {}, static_cast<double>(census.exports));
  }
  return out.Take();
}

Metrics::Metrics(StateSources sources)
    : impl_(std::make_unique<Impl>(sources)) {
  impl_->InitFixedSeries();
}

Metrics::~Metrics() = default;

void Metrics::RecordRpc(absl::string_view method, absl::StatusCode code,
                        absl::Duration latency) {
  impl_->RecordRpc(method, code, latency);
}

void Metrics::RecordMaterialize(const v1::PhaseTimings& timings,
                                absl::string_view rng, uint64_t tensor_bytes) {
  impl_->RecordMaterialize(timings, rng, tensor_bytes);
}

void Metrics::RecordFetchStart(bool resumed) {
  impl_->RecordFetchStart(resumed);
}

void Metrics::AddFetchBytes(uint64_t bytes) { impl_->AddFetchBytes(bytes); }

void Metrics::RecordExportOpened(absl::string_view kind) {
  impl_->RecordExportOpened(kind);
}

void Metrics::RecordExportClosed() { impl_->RecordExportClosed(); }

void Metrics::RecordSessionOpened(bool resumed) {
  impl_->RecordSessionOpened(resumed);
}

void Metrics::RecordSessionEnded(absl::Duration cleanup,
                                 absl::Duration since_detach, size_t handles) {
  impl_->RecordSessionEnded(cleanup, since_detach, handles);
}

void Metrics::RecordLeaseExpiry(absl::Duration cleanup, size_t handles) {
  impl_->RecordLeaseExpiry(cleanup, handles);
}

void Metrics::RecordCredentialReload(absl::string_view kind, bool ok) {
  impl_->RecordCredentialReload(kind, ok);
}

std::string Metrics::TextFormat() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, impl_->Collect());
  return out.str();
}

}  // namespace materializer::metrics
