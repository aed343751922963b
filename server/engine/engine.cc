#include "server/engine/engine.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"
#include "server/delivery/digest.h"
#include "server/delivery/safetensors.h"
#include "server/init/apply.h"
#include "server/load/checkpoint_load.h"
#include "server/init/resolve.h"
#include "server/init/rng_mode.h"
#include "server/init/shard.h"
#include "server/engine/split.h"
#include "server/memory/arena.h"
#include "server/spec/layout.h"
#include "server/spec/meta_check.h"
#include "server/spec/validate.h"

namespace materializer::engine {
namespace {

constexpr size_t kMaxLabelBytes = 256;
constexpr char kSplit[] = "split";

uint64_t MicrosSince(absl::Time start) {
  return static_cast<uint64_t>(
      absl::ToInt64Microseconds(absl::Now() - start));
}

const char* RngName(v1::RngMode mode) {
  return mode == v1::RNG_MODE_TORCH ? "torch" : "portable";
}

void CountMaterialization(metrics::Metrics* metrics,
                          const registry::HandleSpec& spec,
                          const v1::PhaseTimings& timings) {
  if (metrics == nullptr) return;
  metrics->RecordMaterialize(timings, RngName(spec.rng),
                             spec.layout.tensor_bytes);
}

// GetStats' view of the driver; processes for admins only.
void FillDriver(const memory::DriverReport& report, bool with_processes,
                v1::DriverMemory* out) {
  out->set_uuid(report.uuid);
  out->set_name(report.name);
  out->set_total_bytes(report.total_bytes);
  out->set_used_bytes(report.used_bytes);
  out->set_free_bytes(report.free_bytes);
  out->set_server_process_bytes(report.server_process_bytes);
  out->set_caching_allocator_bytes(report.caching_allocator_bytes);
  if (!with_processes) return;
  for (const memory::GpuProcessReport& p : report.other_processes) {
    v1::GpuProcess* process = out->add_processes();
    process->set_pid(p.pid);
    process->set_name(p.name);
    process->set_used_bytes(p.used_bytes);
    process->set_state(memory::ProcessStateName(p.state));
  }
}

// A validated, planned model: everything decided before any memory is
// touched.
struct Prepared {
  std::vector<spec::TensorDesc> tensors;
  init::Resolution resolution;
  spec::Layout layout;
  // Set when the request names a checkpoint.
  std::shared_ptr<const load::LoadPlan> load;
};

// A request's checkpoint, and where to open it.
struct CheckpointRequest {
  const v1::CheckpointSource* source = nullptr;
  const load::CheckpointOpener* opener = nullptr;
  std::string identity;
};

// Every step is linear in the request (the matching of rules is bounded by
// init::kMaxRuleMatchWork) and the long ones poll `cancelled`.
absl::StatusOr<Prepared> Prepare(const v1::ModelSpec& model,
                                 const Cancelled& cancelled,
                                 uint64_t* validate_us, uint64_t* plan_us,
                                 const CheckpointRequest* checkpoint = nullptr) {
  const absl::Time start = absl::Now();
  Prepared prepared;
  ASSIGN_OR_RETURN(prepared.tensors, spec::ValidateTensors(model, cancelled));
  if (!v1::RngMode_IsValid(model.rng())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.rng: unknown mode ", model.rng()));
  }
  RETURN_IF_ERROR(CheckCancelled(cancelled));
  RETURN_IF_ERROR(init::ApplyShards(
      model, init::EffectiveRngMode(model.rng()), prepared.tensors));
  RETURN_IF_ERROR(CheckCancelled(cancelled));
  const std::vector<std::string>* loaded = nullptr;
  if (checkpoint != nullptr) {
    ASSIGN_OR_RETURN(load::LoadPlan plan,
                     load::PlanLoad(*checkpoint->source, prepared.tensors,
                                    *checkpoint->opener, checkpoint->identity));
    prepared.load = std::make_shared<const load::LoadPlan>(std::move(plan));
    loaded = &prepared.load->loaded_descriptions;
  }
  RETURN_IF_ERROR(CheckCancelled(cancelled));
  ASSIGN_OR_RETURN(prepared.resolution,
                   init::ResolveInits(model, prepared.tensors, cancelled,
                                      loaded));
  *validate_us = MicrosSince(start);

  const absl::Time plan_start = absl::Now();
  RETURN_IF_ERROR(CheckCancelled(cancelled));
  ASSIGN_OR_RETURN(prepared.layout, spec::ComputeLayout(prepared.tensors));
  RETURN_IF_ERROR(spec::CheckAgainstMetaTensors(prepared.tensors, cancelled));
  *plan_us = MicrosSince(plan_start);
  return prepared;
}

google::protobuf::Timestamp ToProto(absl::Time time) {
  return google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(
      absl::ToUnixMicros(time));
}

memory::ArenaOptions ArenaOptionsFor(const registry::HandleSpec& spec,
                                     memory::SharedMemoryPool* shm_pool,
                                     const std::string& shm_dir) {
  memory::ArenaOptions options;
  options.shared_memory = spec.exportable;
  options.shared_memory_pool = shm_pool;
  options.shared_memory_dir = shm_dir;
  return options;
}

// Allocates the arena (to_empty) and runs every init; on success the handle
// becomes READY. On failure the reservation or arena is dropped, which
// returns the bytes to the ledger.
// A checkpoint's tensors are written first: a derived init may read them.
absl::Status Build(registry::Handle& handle,
                   std::vector<memory::Reservation> reservations,
                   const PartLayouts* parts,
                   const std::vector<init::ResolvedInit>& inits,
                   const load::LoadPlan* load, load::RangeCache* cache,
                   memory::SharedMemoryPool* shm_pool,
                   const std::string& shm_dir,
                   v1::CheckpointReport* report, v1::PhaseTimings* timings,
                   const Cancelled& cancelled) {
  const registry::HandleSpec& spec = handle.spec();
  // The pool's refill waits while this runs: it would take a core from
  // the init.
  memory::SharedMemoryPool::Active active(shm_pool);
  const absl::Time allocate_start = absl::Now();
  if (shm_pool != nullptr) {
    // The pool's slabs are host memory outside the ledger: a reservation
    // that took the room they sit in gets it back before its arena is
    // allocated (keeping the slabs this arena is about to take).
    uint64_t taking = 0;
    if (spec.exportable && parts == nullptr &&
        reservations.front().device().kind == memory::DeviceKind::kCpu) {
      taking = shm_pool->SlabsFor(reservations.front().bytes()) *
               shm_pool->slab_bytes();
    }
    shm_pool->Trim(taking);
  }
  std::unique_ptr<memory::Arena> arena;
  if (parts == nullptr) {
    ASSIGN_OR_RETURN(arena, memory::Arena::Allocate(
                                std::move(reservations.front()), spec.tensors,
                                spec.layout,
                                ArenaOptionsFor(spec, shm_pool, shm_dir)));
  } else {
    // Split: one arena per device, seen as one.
    std::vector<std::unique_ptr<memory::Arena>> allocated;
    for (size_t p = 0; p < reservations.size(); ++p) {
      ASSIGN_OR_RETURN(std::unique_ptr<memory::Arena> part,
                       memory::Arena::Allocate(std::move(reservations[p]),
                                               parts->tensors[p],
                                               parts->layouts[p]));
      allocated.push_back(std::move(part));
    }
    arena = memory::Arena::Combine(std::move(allocated), parts->bases,
                                   parts->part_of_tensor, parts->local_index);
  }
  timings->set_allocate_us(MicrosSince(allocate_start));

  if (load != nullptr) {
    const absl::Time load_start = absl::Now();
    RETURN_IF_ERROR(load::LoadTensors(*load, spec.tensors, *arena, *cache,
                                      report, cancelled));
    timings->set_checkpoint_us(MicrosSince(load_start));
  }

  const absl::Time init_start = absl::Now();
  RETURN_IF_ERROR(init::ApplyInits(spec.tensors, inits, spec.seed, spec.rng,
                                   *arena, cancelled));
  timings->set_init_us(MicrosSince(init_start));

  const absl::Time register_start = absl::Now();
  handle.MarkReady(std::move(arena));
  timings->set_register_us(MicrosSince(register_start));
  return absl::OkStatus();
}

}  // namespace

Engine::Engine(memory::DevicePool* pool, registry::HandleRegistry* registry,
               ThreadPool* workers, EngineOptions options)
    : pool_(pool),
      registry_(registry),
      workers_(workers),
      options_(std::move(options)) {}

absl::StatusOr<v1::PlanResponse> Engine::Plan(
    const Caller& caller, const v1::PlanRequest& request,
    const Cancelled& cancelled) const {
  uint64_t validate_us = 0;
  uint64_t plan_us = 0;
  ASSIGN_OR_RETURN(Prepared prepared,
                   Prepare(request.model(), cancelled, &validate_us, &plan_us));
  const std::vector<spec::TensorDesc>& tensors = prepared.tensors;
  const spec::Layout& layout = prepared.layout;

  v1::PlanResponse response;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;
  const spec::TensorDesc* largest = nullptr;
  const bool listing = !request.summary_only();
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i % kCancelPollInterval == 0)
      RETURN_IF_ERROR(CheckCancelled(cancelled));
    const spec::TensorDesc& t = tensors[i];
    auto& entry = by_dtype[spec::Name(t.dtype)];
    entry.second += 1;
    if (t.tie_root < 0) {  // a tied tensor's bytes are its root's
      entry.first += t.nbytes;
      if (largest == nullptr || t.nbytes > largest->nbytes) largest = &t;
    }
    if (!listing) continue;
    v1::TensorPlan* plan = response.add_tensors();
    plan->set_name(t.name);
    plan->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    plan->set_dtype(spec::Name(t.dtype));
    plan->set_nbytes(t.nbytes);
    plan->set_arena_offset(layout.offsets[i]);
    plan->set_init(prepared.resolution.inits[i].description);
    for (const v1::InitStepInfo& step :
         prepared.resolution.inits[i].step_infos) {
      *plan->add_steps() = step;
    }
    if (t.is_shard()) {
      plan->mutable_full_shape()->Add(t.shard_full_shape.begin(),
                                      t.shard_full_shape.end());
      plan->mutable_shard_offset()->Add(t.shard_offset.begin(),
                                        t.shard_offset.end());
    }
    if (t.tie_root >= 0) plan->set_tied_to(tensors[t.tie_root].name);
  }
  for (const auto& [dtype, entry] : by_dtype) {
    v1::DtypeBytes* out = response.add_by_dtype();
    out->set_dtype(dtype);
    out->set_nbytes(entry.first);
    out->set_tensors(entry.second);
  }
  response.set_tensor_bytes(layout.tensor_bytes);
  response.set_arena_bytes(layout.arena_bytes);
  response.set_alignment(spec::kArenaAlignment);
  response.set_num_elements(layout.num_elements);
  if (largest != nullptr) {
    response.set_largest_tensor(largest->name);
    response.set_largest_tensor_bytes(largest->nbytes);
  }
  for (size_t i = 0; i < pool_->devices().size(); ++i) {
    v1::DeviceFit* fit = response.add_devices();
    const uint64_t free_bytes =
        pool_->AvailableTo(caller.identity, static_cast<int>(i));
    fit->set_device(pool_->devices()[i].name);
    fit->set_available_bytes(free_bytes);
    fit->set_fits(free_bytes >= layout.arena_bytes);
  }
  if (request.placement().device() == kSplit) {
    ASSIGN_OR_RETURN(
        const SplitUnits units,
        GroupForSplit(tensors, {request.placement().split().no_split().begin(),
                                request.placement().split().no_split().end()}));
    ASSIGN_OR_RETURN(memory::DevicePool::SplitRequest split_request,
                     MakeSplitRequest(request.placement().split(), units));
    absl::StatusOr<memory::DevicePool::SplitPlan> split =
        pool_->PlanSplit(caller.identity, split_request);
    if (split.ok()) {
      std::vector<std::string> names;
      for (int device : split->part_devices) {
        names.push_back(pool_->devices()[device].name);
      }
      response.set_placement(absl::StrJoin(names, "+"));
      for (size_t i = 0; listing && i < tensors.size(); ++i) {
        response.mutable_tensors(static_cast<int>(i))
            ->set_device(names[split->part_of_unit[units.unit_of_tensor[i]]]);
      }
    } else if (split.status().code() != absl::StatusCode::kResourceExhausted) {
      return split.status();  // bad devices or caps
    } else {
      response.add_warnings(std::string(split.status().message()));
    }
  } else {
    absl::StatusOr<int> where =
        pool_->Resolve(caller.identity, request.placement().device(),
                       layout.arena_bytes);
    if (where.ok()) {
      response.set_placement(pool_->devices()[*where].name);
    } else if (where.status().code() != absl::StatusCode::kResourceExhausted) {
      return where.status();  // an unknown device is bad input
    } else {
      response.add_warnings(std::string(where.status().message()));
    }
  }
  for (const std::string& warning : prepared.resolution.warnings) {
    response.add_warnings(warning);
  }
  return response;
}

absl::StatusOr<v1::MaterializeResponse> Engine::Materialize(
    const Caller& caller, const v1::MaterializeRequest& request,
    const Cancelled& cancelled) {
  const absl::Time start = absl::Now();
  v1::MaterializeResponse response;
  v1::PhaseTimings* timings = response.mutable_timings();

  if (request.label().size() > kMaxLabelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("label: ", request.label().size(),
                     " bytes; the limit is ", kMaxLabelBytes));
  }
  absl::Duration ttl = options_.default_ttl;
  if (request.has_ttl()) {
    ttl = absl::Seconds(request.ttl().seconds()) +
          absl::Nanoseconds(request.ttl().nanos());
    if (ttl <= absl::ZeroDuration() || ttl > options_.max_ttl) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ttl: ", absl::FormatDuration(ttl), " is outside (0, ",
          absl::FormatDuration(options_.max_ttl), "]"));
    }
  }
  if (!caller.session.empty() && options_.sessions == nullptr) {
    return absl::FailedPreconditionError("this server has no sessions");
  }
  uint64_t validate_us = 0;
  uint64_t plan_us = 0;
  CheckpointRequest checkpoint;
  const bool has_checkpoint = !request.checkpoint().path().empty();
  if (has_checkpoint) {
    if (options_.checkpoint_opener == nullptr ||
        options_.checkpoint_cache == nullptr) {
      return absl::FailedPreconditionError(
          "checkpoint.path: this server reads no checkpoints (start it with "
          "--checkpoint_roots)");
    }
    checkpoint = {&request.checkpoint(), options_.checkpoint_opener,
                  caller.identity};
  } else if (request.checkpoint().ByteSizeLong() != 0) {
    return absl::InvalidArgumentError(
        "checkpoint: key rules, dtype_policy or require_all without "
        "checkpoint.path");
  }
  ASSIGN_OR_RETURN(Prepared prepared,
                   Prepare(request.model(), cancelled, &validate_us, &plan_us,
                           has_checkpoint ? &checkpoint : nullptr));
  timings->set_validate_us(validate_us);
  timings->set_plan_us(plan_us);

  if (request.exportable() && request.placement().device() == kSplit) {
    return absl::InvalidArgumentError(
        "exportable: a handle split across devices cannot be exported; "
        "place it on one device");
  }
  const bool open_export = request.has_open_export();
  if (open_export) {
    if (!request.open_export().handle().empty()) {
      return absl::InvalidArgumentError(
          "open_export.handle: must be empty (the new handle is the one "
          "exported)");
    }
    if (request.async()) {
      return absl::InvalidArgumentError(
          "open_export: an async Materialize returns before the handle is "
          "READY, and only a READY handle can be exported; call "
          "ExportHandle once it is");
    }
    if (request.placement().device() == kSplit) {
      return absl::InvalidArgumentError(
          "open_export: a handle split across devices cannot be exported; "
          "place it on one device");
    }
  }
  registry::HandleSpec spec;
  const absl::Time reserve_start = absl::Now();
  std::vector<memory::Reservation> reservations;
  std::shared_ptr<const PartLayouts> parts;
  if (request.placement().device() == kSplit) {
    ASSIGN_OR_RETURN(
        const SplitUnits units,
        GroupForSplit(prepared.tensors,
                      {request.placement().split().no_split().begin(),
                       request.placement().split().no_split().end()}));
    ASSIGN_OR_RETURN(memory::DevicePool::SplitRequest split_request,
                     MakeSplitRequest(request.placement().split(), units));
    ASSIGN_OR_RETURN(memory::DevicePool::SplitReservation split,
                     pool_->ReserveSplit(caller.identity, split_request));
    std::vector<int> part_of_tensor(prepared.tensors.size());
    for (size_t i = 0; i < part_of_tensor.size(); ++i) {
      part_of_tensor[i] = split.plan.part_of_unit[units.unit_of_tensor[i]];
    }
    ASSIGN_OR_RETURN(PartLayouts laid_out,
                     LayoutParts(prepared.tensors, part_of_tensor,
                                 static_cast<int>(split.parts.size())));
    std::vector<std::string> names;
    for (const memory::Reservation& r : split.parts) {
      names.push_back(r.device().name);
    }
    spec.device = absl::StrJoin(names, "+");
    for (size_t i = 0; i < part_of_tensor.size(); ++i) {
      spec.tensor_devices.push_back(names[part_of_tensor[i]]);
    }
    prepared.layout = laid_out.global;
    parts = std::make_shared<const PartLayouts>(std::move(laid_out));
    reservations = std::move(split.parts);
  } else {
    ASSIGN_OR_RETURN(memory::Reservation reservation,
                     pool_->Reserve(caller.identity,
                                    request.placement().device(),
                                    prepared.layout.arena_bytes));
    if (open_export && !request.exportable() &&
        reservation.device().kind == memory::DeviceKind::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "open_export: the handle would be on ", reservation.device().name,
          " in private memory, which another process cannot map; set "
          "exportable"));
    }
    spec.device = reservation.device().name;
    reservations.push_back(std::move(reservation));
  }
  timings->set_reserve_us(MicrosSince(reserve_start));

  spec.owner = caller.identity;
  spec.label = request.label();
  spec.tensors = std::move(prepared.tensors);
  spec.init_descriptions.reserve(prepared.resolution.inits.size());
  spec.init_steps.reserve(prepared.resolution.inits.size());
  for (init::ResolvedInit& resolved : prepared.resolution.inits) {
    spec.init_descriptions.push_back(resolved.description);
    spec.init_steps.push_back(std::move(resolved.step_infos));
  }
  spec.layout = std::move(prepared.layout);
  spec.seed = request.model().seed();
  spec.exportable = request.exportable();
  spec.rng = init::EffectiveRngMode(request.model().rng());
  // A handle belongs to the caller's session, or holds a lease of its own.
  std::shared_ptr<registry::Handle> handle;
  if (caller.session.empty()) {
    spec.ttl = ttl;
    handle = registry_->Create(std::move(spec));
  } else {
    spec.session = caller.session;
    // Registered under the session's lock, so the session cannot end
    // between the check and the binding. On error the reservation is
    // dropped: nothing stays counted.
    RETURN_IF_ERROR(options_.sessions->WithLiveSession(
        caller.identity, caller.session,
        [&] { handle = registry_->Create(std::move(spec)); }));
  }

  response.set_handle(handle->id());
  response.set_device(handle->spec().device);
  response.set_arena_bytes(handle->spec().layout.arena_bytes);
  response.set_tensor_bytes(handle->spec().layout.tensor_bytes);
  response.set_num_tensors(
      static_cast<uint32_t>(handle->spec().tensors.size()));
  for (const std::string& warning : prepared.resolution.warnings) {
    response.add_warnings(warning);
  }
  std::shared_ptr<const load::LoadPlan> load_plan = prepared.load;
  if (load_plan != nullptr) {
    v1::CheckpointReport* report = response.mutable_checkpoint();
    report->set_tensors_loaded(load_plan->tensors_loaded);
    report->set_tensors_assembled(load_plan->tensors_assembled);
    uint32_t own = 0;
    for (const spec::TensorDesc& t : handle->spec().tensors) {
      if (t.tie_root < 0) ++own;
    }
    report->set_tensors_initialized(own - load_plan->tensors_loaded);
    report->set_unused_keys_total(
        static_cast<uint32_t>(load_plan->unused_keys.size()));
    for (size_t k = 0; k < load_plan->unused_keys.size() && k < 1000; ++k) {
      report->add_unused_keys(load_plan->unused_keys[k]);
    }
  }
  load::RangeCache* cache = options_.checkpoint_cache;

  if (request.async()) {
    // std::function needs a copyable closure; the move-only pieces ride in
    // shared_ptrs.
    auto moved_reservations =
        std::make_shared<std::vector<memory::Reservation>>(
            std::move(reservations));
    auto inits = std::make_shared<std::vector<init::ResolvedInit>>(
        std::move(prepared.resolution.inits));
    // Under the caller's identity: it counts against the client's share of
    // the workers (common/thread_pool.h).
    workers_->Schedule(caller.identity, [handle, moved_reservations, parts,
                                         inits, load_plan, cache, start,
                                         shm_pool = options_.shm_pool,
                                         shm_dir = options_.shm_dir,
                                         before = *timings,
                                         metrics = options_.metrics] {
      v1::PhaseTimings build = before;
      v1::CheckpointReport report;  // no one to tell; Describe says more
      absl::Status status =
          Build(*handle, std::move(*moved_reservations), parts.get(), *inits,
                load_plan.get(), cache, shm_pool, shm_dir, &report, &build,
                /*cancelled=*/[handle] { return handle->released(); });
      if (!status.ok()) {
        MLOG(WARNING) << "async materialization of " << handle->id()
                      << " failed: " << status;
        handle->MarkFailed(status.ToString());
        return;
      }
      build.set_total_us(MicrosSince(start));
      CountMaterialization(metrics, handle->spec(), build);
    });
    response.set_state(v1::HANDLE_STATE_MATERIALIZING);
    timings->set_total_us(MicrosSince(start));
    return response;
  }

  absl::Status status =
      Build(*handle, std::move(reservations), parts.get(),
            prepared.resolution.inits, load_plan.get(), cache,
            options_.shm_pool, options_.shm_dir,
            load_plan != nullptr ? response.mutable_checkpoint() : nullptr,
            timings, cancelled);
  if (!status.ok()) {
    registry_->Forget(handle->id());
    return status;
  }
  if (open_export) {
    absl::StatusOr<v1::ExportResponse> exported =
        Export(caller, handle, request.open_export().importer_device_uuid());
    if (!exported.ok()) {
      // Nothing left held: the caller never learns this handle.
      registry_->Forget(handle->id());
      return exported.status();
    }
    *response.mutable_opened_export() = std::move(*exported);
  }
  response.set_state(v1::HANDLE_STATE_READY);
  timings->set_total_us(MicrosSince(start));
  CountMaterialization(options_.metrics, handle->spec(), *timings);
  MLOG(INFO) << "materialized " << handle->id() << " for " << caller.identity
             << ": " << handle->spec().tensors.size() << " tensors, "
             << FormatBytes(handle->spec().layout.arena_bytes) << " on "
             << handle->spec().device << " in " << timings->total_us()
             << " us";
  return response;
}

absl::StatusOr<v1::HandleInfo> Engine::Describe(
    const Caller& caller, const v1::DescribeRequest& request,
    const Cancelled& cancelled) const {
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  const registry::HandleSpec& spec = handle->spec();
  const v1::HandleState state = handle->state();
  v1::HandleInfo info;
  info.set_handle(handle->id());
  info.set_state(state);
  info.set_owner(spec.owner);
  info.set_label(spec.label);
  info.set_device(spec.device);
  *info.mutable_created_at() = ToProto(handle->created());
  info.set_arena_bytes(spec.layout.arena_bytes);
  info.set_tensor_bytes(spec.layout.tensor_bytes);
  info.set_error(handle->error());
  info.set_seed(spec.seed);
  info.set_rng(spec.rng);
  info.set_session(spec.session);
  if (spec.session.empty() && spec.ttl != absl::InfiniteDuration()) {
    *info.mutable_lease_expires_at() = ToProto(handle->lease_expiry());
  }
  const std::string& device =
      state == v1::HANDLE_STATE_READY ? spec.device : std::string("meta");
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    if (i % kCancelPollInterval == 0)
      RETURN_IF_ERROR(CheckCancelled(cancelled));
    const spec::TensorDesc& t = spec.tensors[i];
    v1::TensorInfo* out = info.add_tensors();
    out->set_name(t.name);
    out->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    out->set_dtype(spec::Name(t.dtype));
    out->set_device(state == v1::HANDLE_STATE_READY && !spec.tensor_devices.empty()
                        ? spec.tensor_devices[i]
                        : device);
    out->set_nbytes(t.nbytes);
    out->set_arena_offset(spec.layout.offsets[i]);
    out->set_kind(t.is_buffer ? v1::TENSOR_KIND_BUFFER
                              : v1::TENSOR_KIND_PARAMETER);
    out->set_persistent(t.persistent);
    out->set_module_type(t.module_type);
    out->set_init(spec.init_descriptions[i]);
    if (i < spec.init_steps.size()) {
      for (const v1::InitStepInfo& step : spec.init_steps[i]) {
        *out->add_steps() = step;
      }
    }
    if (t.tie_root >= 0) out->set_tied_to(spec.tensors[t.tie_root].name);
    if (t.is_shard()) {
      out->mutable_full_shape()->Add(t.shard_full_shape.begin(),
                                     t.shard_full_shape.end());
      out->mutable_shard_offset()->Add(t.shard_offset.begin(),
                                       t.shard_offset.end());
    }
  }
  RETURN_IF_ERROR(AddDeliveryInfo(*handle, &info, cancelled));
  return info;
}

absl::StatusOr<v1::ReleaseResponse> Engine::Release(
    const Caller& caller, const v1::ReleaseRequest& request) {
  ASSIGN_OR_RETURN(const uint32_t closed, CloseExportsOf(caller, request));
  ASSIGN_OR_RETURN(registry::ReleaseResult result,
                   registry_->Release(caller.identity, request.handle(),
                                      request.force()));
  v1::ReleaseResponse response;
  response.set_exports_closed(closed);
  response.set_released(result.released);
  response.set_freed_bytes(result.freed_bytes);
  if (result.released) {
    MLOG(INFO) << "released " << request.handle() << " of " << caller.identity
               << ": " << FormatBytes(result.freed_bytes);
  }
  return response;
}

v1::ListHandlesResponse Engine::ListHandles(const Caller& caller) const {
  v1::ListHandlesResponse response;
  for (const std::shared_ptr<registry::Handle>& handle :
       registry_->List(caller.identity)) {
    v1::HandleSummary* out = response.add_handles();
    out->set_handle(handle->id());
    out->set_state(handle->state());
    out->set_label(handle->spec().label);
    out->set_device(handle->spec().device);
    out->set_arena_bytes(handle->spec().layout.arena_bytes);
    out->set_num_tensors(static_cast<uint32_t>(handle->spec().tensors.size()));
    *out->mutable_created_at() = ToProto(handle->created());
  }
  return response;
}

absl::StatusOr<v1::RenewResponse> Engine::Renew(
    const Caller& caller, const v1::RenewRequest& request) {
  // Get renews the lease of the caller's handle.
  ASSIGN_OR_RETURN(std::shared_ptr<registry::Handle> handle,
                   registry_->Get(caller.identity, request.handle()));
  v1::RenewResponse response;
  if (!handle->spec().session.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "handle ", handle->id(), " is bound to session ",
        handle->spec().session,
        ", which keeps it alive; only handles outside a session have a "
        "lease to renew"));
  }
  if (handle->spec().ttl != absl::InfiniteDuration()) {
    *response.mutable_lease_expires_at() = ToProto(handle->lease_expiry());
  }
  return response;
}

absl::StatusOr<v1::CheckpointContents> Engine::InspectCheckpoint(
    const Caller& caller, const v1::InspectCheckpointRequest& request,
    const Cancelled& cancelled) const {
  if (options_.checkpoint_opener == nullptr ||
      options_.checkpoint_cache == nullptr) {
    return absl::FailedPreconditionError(
        "path: this server reads no checkpoints (start it with "
        "--checkpoint_roots)");
  }
  if (request.path().empty()) {
    return absl::InvalidArgumentError("path: empty; name ROOT/relative/path");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const load::Checkpoint> ckpt,
                   options_.checkpoint_opener->Open(request.path(),
                                                    caller.identity));
  v1::CheckpointContents out;
  out.set_path(ckpt->path);
  constexpr uint64_t kPiece = uint64_t{4} << 20;
  std::string buffer;
  for (size_t f = 0; f < ckpt->files.size(); ++f) {
    const load::FileSource& file = *ckpt->files[f];
    v1::CheckpointFile* info = out.add_files();
    info->set_path(file.label());
    info->set_bytes(file.key().size);
    info->set_format(ckpt->formats[f]);
    if (!request.digest()) continue;
    delivery::Hasher hasher;
    load::RangeCache::Counters counters;
    for (uint64_t at = 0; at < file.key().size; at += kPiece) {
      RETURN_IF_ERROR(CheckCancelled(cancelled));
      const uint64_t length = std::min(kPiece, file.key().size - at);
      buffer.resize(length);
      RETURN_IF_ERROR(options_.checkpoint_cache->Read(file, at, length,
                                                      buffer.data(), &counters));
      hasher.Update(buffer.data(), length);
    }
    info->set_digest(delivery::FormatDigest(hasher.Finish()));
  }
  uint64_t total = 0;
  for (const load::CheckpointEntry& e : ckpt->entries) {
    v1::CheckpointEntryInfo* t = out.add_tensors();
    t->set_key(e.key);
    t->set_dtype(spec::Name(e.dtype));
    t->mutable_shape()->Add(e.shape.begin(), e.shape.end());
    t->set_nbytes(e.nbytes);
    t->set_file(static_cast<uint32_t>(e.file));
    t->set_offset(e.offset);
    total += e.nbytes;
  }
  out.set_tensor_bytes(total);
  out.set_config_json(ckpt->config_json);
  return out;
}

v1::GetStatsResponse Engine::GetStats(const Caller& caller) const {
  const memory::PoolSnapshot snapshot = pool_->Snapshot();
  v1::GetStatsResponse response;
  for (const memory::DeviceUsage& device : snapshot.devices) {
    v1::DeviceStats* out = response.add_devices();
    out->set_device(device.device.name);
    out->set_capacity_bytes(device.device.capacity_bytes);
    out->set_reserved_bytes(device.usage.reserved_bytes);
    out->set_in_use_bytes(device.usage.in_use_bytes);
    out->set_peak_bytes(device.usage.peak_bytes);
    out->set_handles(device.usage.handles);
    out->set_handed_over_bytes(device.usage.handed_over_bytes);
    if (options_.gpu != nullptr && options_.gpu->Covers(device.device)) {
      // A driver that cannot answer leaves `driver` unset, as on a CPU.
      absl::StatusOr<memory::DriverReport> report =
          options_.gpu->Report(device.device);
      if (report.ok()) {
        FillDriver(*report, caller.admin, out->mutable_driver());
      }
    }
  }
  auto limit = [](uint64_t bytes) {
    return bytes == memory::kNoByteLimit ? 0 : bytes;
  };
  for (const auto& [client, usage] : snapshot.clients) {
    if (!caller.admin && client != caller.identity) continue;
    v1::ClientStats* out = response.add_clients();
    const memory::Quota& quota = pool_->quotas().For(client);
    out->set_client(client);
    out->set_reserved_bytes(usage.total.reserved_bytes);
    out->set_in_use_bytes(usage.total.in_use_bytes);
    out->set_peak_bytes(usage.total.peak_bytes);
    out->set_handles(usage.total.handles);
    out->set_handed_over_bytes(usage.total.handed_over_bytes);
    out->set_quota_total_bytes(limit(quota.total_bytes));
    out->set_quota_handles(
        quota.handles == memory::kNoHandleLimit ? 0 : quota.handles);
    for (size_t i = 0; i < usage.per_device.size(); ++i) {
      const memory::Usage& on_device = usage.per_device[i];
      v1::ClientDeviceStats* d = out->add_devices();
      d->set_device(snapshot.devices[i].device.name);
      d->set_reserved_bytes(on_device.reserved_bytes);
      d->set_in_use_bytes(on_device.in_use_bytes);
      d->set_peak_bytes(on_device.peak_bytes);
      d->set_handles(on_device.handles);
      d->set_handed_over_bytes(on_device.handed_over_bytes);
      d->set_quota_bytes(limit(quota.BytesOn(snapshot.devices[i].device.name)));
    }
    if (options_.sessions != nullptr) {
      out->set_sessions(
          static_cast<uint32_t>(options_.sessions->CountFor(client)));
    }
  }
  response.set_reserved_bytes(snapshot.total.reserved_bytes);
  response.set_in_use_bytes(snapshot.total.in_use_bytes);
  response.set_handles(snapshot.total.handles);
  response.set_handed_over_bytes(snapshot.total.handed_over_bytes);
  if (options_.checkpoint_cache != nullptr) {
    const load::RangeCache::Stats cache = options_.checkpoint_cache->stats();
    v1::CheckpointCacheStats* out = response.mutable_checkpoint_cache();
    out->set_capacity_bytes(cache.capacity_bytes);
    out->set_cached_bytes(cache.cached_bytes);
    out->set_bytes_read_from_files(cache.bytes_read_from_files);
    out->set_bytes_served_from_cache(cache.bytes_served_from_cache);
    out->set_evicted_bytes(cache.evicted_bytes);
  }
  if (options_.shm_pool != nullptr) {
    const memory::SharedMemoryPool::Stats pool = options_.shm_pool->stats();
    v1::SharedMemoryPoolStats* out = response.mutable_shm_pool();
    out->set_target_bytes(pool.target_bytes);
    out->set_max_bytes(pool.max_bytes);
    out->set_adaptive(pool.adaptive);
    out->set_trimmed_bytes(pool.trimmed_bytes_total);
    out->set_bytes(pool.bytes);
    out->set_taken_bytes(pool.taken_bytes_total);
    out->set_filled_bytes(pool.filled_bytes_total);
    out->set_last_error(pool.last_error);
  }
  return response;
}

}  // namespace materializer::engine
