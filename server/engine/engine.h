#ifndef MATERIALIZER_SERVER_ENGINE_ENGINE_H_
#define MATERIALIZER_SERVER_ENGINE_ENGINE_H_

// The request paths of the Materializer API as plain C++ over the core
// (spec, init, memory, registry, delivery). The gRPC service is a thin
// adapter over this class; tests drive it directly too.
//
// Materialize, step by step (ARCHITECTURE.md):
//   validate -> resolve inits -> layout + meta check -> reserve (ledger)
//   -> register (MATERIALIZING) -> allocate arena (to_empty) -> init
//   -> READY.
// Any failure after the reservation rolls back: the reservation or arena
// is dropped (returning its bytes) and the handle is unregistered (or, for
// an async request, marked FAILED holding nothing).

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"
#include "server/common/cancel.h"
#include "server/common/thread_pool.h"
#include "server/delivery/weight_stream.h"
#include "server/load/checkpoint_files.h"
#include "server/load/range_cache.h"
#include "server/memory/gpu_report.h"
#include "server/memory/pool.h"
#include "server/memory/shm_pool.h"
#include "server/metrics/metrics.h"
#include "server/registry/registry.h"
#include "server/registry/session.h"

namespace materializer::engine {

// Who is calling. Set by the service layer from authentication only, never
// from a request field.
struct Caller {
  std::string identity;
  // The session the call names (metadata "x-materializer-session"), or "".
  std::string session;
  // Admins see every client in GetStats.
  bool admin = false;
};

struct EngineOptions {
  // Sessions that handles can be bound to; null: calls naming a session
  // fail.
  registry::SessionTable* sessions = nullptr;
  // Lease of a handle created outside a session when the request sets no
  // ttl; and the longest ttl a request may ask for.
  absl::Duration default_ttl = absl::Hours(1);
  absl::Duration max_ttl = absl::Hours(24 * 30);
  // Where materializations and exports are counted; null: nowhere.
  metrics::Metrics* metrics = nullptr;
  // The GPU driver's view of the devices it covers, for GetStats; null:
  // none (CPU-only hosts, no NVML).
  const memory::GpuReporter* gpu = nullptr;
  // Threads that compute a handle's per-tensor digests (one tensor per
  // task); 0 = one per hardware thread.
  int digest_threads = 0;
  // Where MaterializeRequest.checkpoint paths are opened, and the cache
  // their bytes are read through (server/load); null: this server reads
  // no checkpoints (FAILED_PRECONDITION for a request that names one).
  const load::CheckpointOpener* checkpoint_opener = nullptr;
  load::RangeCache* checkpoint_cache = nullptr;
  // Resident shared memory for exportable CPU arenas (--shm_pool_bytes);
  // null: every such arena gets fresh pages.
  memory::SharedMemoryPool* shm_pool = nullptr;
  // Where an exportable CPU arena's fresh file goes (--shm_dir).
  std::string shm_dir = "/dev/shm";
};

// Thread-safe. The pool, registry, worker pool and what `options` points to
// must outlive the engine;
// the worker pool must be drained (destroyed) before the engine is, since
// async materializations run there and use it.
//
// Calls that can take long take `cancelled` (common/cancel.h): once it
// says the caller is gone they stop with CANCELLED, having kept nothing.
class Engine {
 public:
  Engine(memory::DevicePool* pool, registry::HandleRegistry* registry,
         ThreadPool* workers, EngineOptions options = EngineOptions());

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  absl::StatusOr<v1::PlanResponse> Plan(const Caller& caller,
                                        const v1::PlanRequest& request,
                                        const Cancelled& cancelled = {}) const;

  // `cancelled` is polled while validating and planning, and during init
  // of a synchronous request: once the caller has gone away the work stops
  // and rolls back. An async request's init runs on the worker pool under
  // the caller's identity and is not cancelled with the call.
  absl::StatusOr<v1::MaterializeResponse> Materialize(
      const Caller& caller, const v1::MaterializeRequest& request,
      const Cancelled& cancelled = {});

  absl::StatusOr<v1::HandleInfo> Describe(
      const Caller& caller, const v1::DescribeRequest& request,
      const Cancelled& cancelled = {}) const;

  // Opens the byte stream of a READY handle. FAILED_PRECONDITION while the
  // handle's tensors are still meta (materializing, or failed).
  absl::StatusOr<std::unique_ptr<delivery::WeightStream>> OpenFetch(
      const Caller& caller, const v1::FetchRequest& request,
      const Cancelled& cancelled = {}) const;

  // The layout OpenFetch would stream for the same request: size, digest
  // and each tensor's byte range. Computes (and caches) digests on first
  // use, so it can take a while for a large handle.
  absl::StatusOr<v1::FileLayout> DescribeFile(
      const Caller& caller, const v1::FetchRequest& request,
      const Cancelled& cancelled = {}) const;

  // Fills the delivery fields of Describe's answer for `handle`: per-tensor
  // digests and the handle digest (READY only; computed on first use and
  // cached) and the number of live exports. `info->tensors` must be in
  // spec order.
  absl::Status AddDeliveryInfo(const registry::Handle& handle,
                               v1::HandleInfo* info,
                               const Cancelled& cancelled = {}) const;

  // Zero-copy export of a READY handle to a co-located process: a
  // shared-memory file (CPU arenas materialized with exportable) or a CUDA
  // IPC handle. The handle cannot be released while exported unless the
  // release is forced.
  absl::StatusOr<v1::ExportResponse> ExportHandle(
      const Caller& caller, const v1::ExportRequest& request);
  absl::StatusOr<v1::CloseExportResponse> CloseExport(
      const Caller& caller, const v1::CloseExportRequest& request);

  // Closes request.close_exports first, then releases the handle.
  absl::StatusOr<v1::ReleaseResponse> Release(
      const Caller& caller, const v1::ReleaseRequest& request);

  // Renews the lease of a handle outside a session.
  absl::StatusOr<v1::RenewResponse> Renew(const Caller& caller,
                                          const v1::RenewRequest& request);

  v1::ListHandlesResponse ListHandles(const Caller& caller) const;

  // MaterializeRequest.checkpoint's view of a checkpoint (its files and
  // tensors), with each file's digest when asked (read through the
  // checkpoint cache). FAILED_PRECONDITION on a server without roots; the
  // opener's statuses for the path.
  absl::StatusOr<v1::CheckpointContents> InspectCheckpoint(
      const Caller& caller, const v1::InspectCheckpointRequest& request,
      const Cancelled& cancelled) const;

  v1::GetStatsResponse GetStats(const Caller& caller) const;

 private:
  // ExportHandle of a handle already looked up (also Materialize's
  // open_export).
  absl::StatusOr<v1::ExportResponse> Export(
      const Caller& caller, const std::shared_ptr<registry::Handle>& handle,
      const std::string& importer_device_uuid);
  // Release's first step: checks every id of request.close_exports (all
  // before any is closed), then closes those still open; the number
  // closed.
  absl::StatusOr<uint32_t> CloseExportsOf(const Caller& caller,
                                          const v1::ReleaseRequest& request);

  memory::DevicePool* const pool_;
  registry::HandleRegistry* const registry_;
  ThreadPool* const workers_;
  const EngineOptions options_;
};

}  // namespace materializer::engine

#endif  // MATERIALIZER_SERVER_ENGINE_ENGINE_H_
