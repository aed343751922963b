#ifndef MATERIALIZER_SERVER_MEMORY_POOL_H_
#define MATERIALIZER_SERVER_MEMORY_POOL_H_

// The device pool and its ledger: which bytes of which device belong to
// which client. Memory is admitted in two steps, so that nothing is ever
// allocated that was not first counted:
//
//   ASSIGN_OR_RETURN(Reservation r, pool.Reserve("alice", "auto", bytes));
//   // ... allocate; on failure just drop `r`: the bytes go back.
//   Allocation a = std::move(r).Commit();   // reserved -> in use
//   // ... the arena holds `a`; dropping it frees the bytes in the ledger.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/memory/device.h"
#include "server/memory/gpu_driver.h"
#include "server/memory/quota.h"

namespace materializer::memory {

class DevicePool;

// Counters of one client on one device, or of a device, or of a client.
struct Usage {
  uint64_t reserved_bytes = 0;
  uint64_t in_use_bytes = 0;
  // Bytes of released shared-memory arenas that an importer still maps
  // (the SDK's handover): the pages live on, charged to this server's
  // memory cgroup, until the last importer lets go (DevicePool::HandOver).
  uint64_t handed_over_bytes = 0;
  // Highest reserved + in_use + handed_over seen.
  uint64_t peak_bytes = 0;
  // Live reservations plus allocations (one per handle).
  uint32_t handles = 0;
};

// What counts against a device's capacity and a client's quota.
inline uint64_t HeldBytes(const Usage& usage) {
  return usage.reserved_bytes + usage.in_use_bytes + usage.handed_over_bytes;
}

struct DeviceUsage {
  DeviceConfig device;
  Usage usage;
};

struct ClientUsage {
  Usage total;
  std::vector<Usage> per_device;  // pool order
};

struct PoolSnapshot {
  std::vector<DeviceUsage> devices;          // pool order
  std::map<std::string, ClientUsage> clients;  // clients holding anything
  Usage total;
};

// Bytes counted as in use for one handle. Move-only; destruction returns the
// bytes to the ledger. Thread-compatible (the pool it points to is
// thread-safe).
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& other) noexcept { *this = std::move(other); }
  Allocation& operator=(Allocation&& other) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();

  uint64_t bytes() const { return bytes_; }
  int device_index() const { return device_; }
  const std::string& client() const { return client_; }

  // The handle is gone but another process still maps its shared-memory
  // files (`fds`, each with an importer's shared flock): the bytes move
  // from in use to handed over, and the pool keeps the descriptors until
  // no importer holds a lock on any of them (DevicePool::HandOver).
  void HandOver(std::vector<int> fds) &&;

 private:
  friend class Reservation;
  DevicePool* pool_ = nullptr;
  std::string client_;
  int device_ = -1;
  uint64_t bytes_ = 0;
};

// Bytes admitted for one handle but not yet allocated. Move-only;
// destruction without Commit() returns them (the rollback path).
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation();

  // Moves the bytes from reserved to in use.
  Allocation Commit() &&;

  uint64_t bytes() const { return bytes_; }
  int device_index() const { return device_; }
  const DeviceConfig& device() const;
  const std::string& client() const { return client_; }

 private:
  friend class DevicePool;
  DevicePool* pool_ = nullptr;
  std::string client_;
  int device_ = -1;
  uint64_t bytes_ = 0;
};

// Bytes of a device's driver-reported free memory that admission leaves
// alone: cudaMalloc rounds allocations up to 2 MiB pages, and init kernels
// (torch mode) allocate temporaries while they run.
inline constexpr uint64_t kDefaultDriverHeadroom = uint64_t{256} << 20;

// Admission against what a GPU's driver says is free, besides the ledger.
// The ledger only knows what this server handed out; memory held by other
// processes (or left behind by dead ones) would otherwise surface as a
// failed cudaMalloc after the bytes were admitted.
struct DriverAdmission {
  // Not owned; must outlive the pool. Null: the ledger alone.
  const GpuDriver* driver = nullptr;
  uint64_t headroom_bytes = kDefaultDriverHeadroom;
};

// Thread-safe. Must outlive every Reservation and Allocation it issued.
class DevicePool {
 public:
  // Devices in pool order; names must be unique.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(
      std::vector<DeviceConfig> devices, QuotaBook quotas = QuotaBook(),
      DriverAdmission driver = DriverAdmission());

  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool();

  const std::vector<DeviceConfig>& devices() const { return devices_; }

  // Checks the handed-over files now (a thread does it every
  // kHandOverPollInterval): those no importer holds any more are closed
  // and their bytes leave the ledger. Reserve and ReserveSplit call it
  // first, so a process that just exited never causes a refusal.
  void SweepHandedOver();

  // Admits `bytes` (one handle) for `client` on the device `placement`
  // names, atomically, within the device's free bytes and the client's
  // quota, and, on a device the driver reports on, within the driver's
  // free bytes less the headroom and less the bytes already reserved there
  // but not yet allocated. Placement: "" or "auto" picks the best fit: the device with the
  // least room that still fits (ties: pool order), which keeps large holes
  // free for large models. INVALID_ARGUMENT for a device the pool does not
  // have; RESOURCE_EXHAUSTED, with requested / free / quota figures, when it
  // does not fit. Nothing changes on error.
  absl::StatusOr<Reservation> Reserve(absl::string_view client,
                                      absl::string_view placement,
                                      uint64_t bytes);

  // Placement "split": units (the model's modules, in order, each of its
  // byte size) fill the devices in order, the way accelerate's
  // infer_auto_device_map does: a unit goes to the current device if it
  // fits there (within the device's free bytes, its max_memory cap and the
  // client's quota), else to the next device; a unit is never cut. One
  // reservation per device used; all or nothing, atomically.
  struct SplitRequest {
    // Pool device names in fill order; empty: every device, pool order.
    std::vector<std::string> devices;
    // Caps per device name (bytes this handle may put there).
    std::map<std::string, uint64_t, std::less<>> max_memory;
    std::vector<uint64_t> unit_bytes;
    // For messages: what each unit is (e.g. its module's name).
    std::vector<std::string> unit_names;
  };
  struct SplitPlan {
    // Pool device index of each part, in fill order, and the part of each
    // unit (parts without units are not made).
    std::vector<int> part_devices;
    std::vector<uint64_t> part_bytes;
    std::vector<int> part_of_unit;
  };
  struct SplitReservation {
    SplitPlan plan;
    std::vector<Reservation> parts;  // one per plan.part_devices
  };
  // INVALID_ARGUMENT for unknown device names; RESOURCE_EXHAUSTED naming
  // the unit that fits nowhere, with the figures.
  absl::StatusOr<SplitPlan> PlanSplit(absl::string_view client,
                                      const SplitRequest& request) const;
  absl::StatusOr<SplitReservation> ReserveSplit(absl::string_view client,
                                                const SplitRequest& request);

  // Where `placement` would put `bytes` for `client` now, without
  // reserving: the device index, or the error Reserve would give.
  absl::StatusOr<int> Resolve(absl::string_view client,
                              absl::string_view placement,
                              uint64_t bytes) const;

  // Bytes of device `index` the ledger has not handed out (any client).
  uint64_t FreeBytes(int index) const;
  // Bytes device `index` could still admit for `client`: its free bytes
  // within what the client's quota and the driver's free memory leave.
  uint64_t AvailableTo(absl::string_view client, int index) const;

  const QuotaBook& quotas() const { return quotas_; }

  PoolSnapshot Snapshot() const;

 private:
  friend class Reservation;
  friend class Allocation;

  DevicePool(std::vector<DeviceConfig> devices, QuotaBook quotas,
             DriverAdmission driver);

  // The driver's free bytes per device (pool order), read before taking
  // mu_ (a driver call may take a while); nullopt where the driver does
  // not report on the device or cannot answer.
  using DriverFree = std::vector<std::optional<uint64_t>>;
  DriverFree SampleDriver() const;

  absl::StatusOr<SplitPlan> PlanSplitLocked(absl::string_view client,
                                            const SplitRequest& request,
                                            const DriverFree& driver) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Reservation ReserveLocked(absl::string_view client, int device,
                            uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<int> ResolveLocked(absl::string_view client,
                                    absl::string_view placement,
                                    uint64_t bytes,
                                    const DriverFree& driver) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t FreeBytesLocked(int index) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Bytes the driver's figure leaves for new reservations on device
  // `index`: free less headroom less bytes reserved but not yet allocated;
  // kNoByteLimit without a figure.
  uint64_t DriverRoomLocked(int index, const DriverFree& driver) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t AvailableLocked(absl::string_view client, int index,
                           const DriverFree& driver) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why `client` cannot put `bytes` on device `index`, or "" if it can.
  std::string ShortfallLocked(absl::string_view client, int index,
                              uint64_t bytes, const DriverFree& driver) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  void Unreserve(const std::string& client, int device, uint64_t bytes);
  void CommitReservation(const std::string& client, int device,
                         uint64_t bytes);
  void Free(const std::string& client, int device, uint64_t bytes);
  void HandOver(const std::string& client, int device, uint64_t bytes,
                std::vector<int> fds);
  void WatchHandedOver();

  struct ClientLedger {
    std::vector<Usage> per_device;  // indexed like devices_
    Usage total;
  };

  // Applies one change to the four counters it touches (device, client on
  // device, client, server), keeping their peaks.
  template <typename Change>
  void ApplyLocked(const std::string& client, int device, Change change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<DeviceConfig> devices_;
  const QuotaBook quotas_;
  const DriverAdmission driver_;

  mutable absl::Mutex mu_;
  // Guards every counter below.
  std::vector<Usage> device_usage_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ClientLedger, std::less<>> clients_
      ABSL_GUARDED_BY(mu_);
  Usage total_ ABSL_GUARDED_BY(mu_);

  // Handed-over arenas, each until no importer holds its files.
  struct HandedOver {
    std::string client;
    int device = -1;
    uint64_t bytes = 0;
    std::vector<int> fds;
  };
  // Never held together with mu_.
  absl::Mutex handed_mu_;
  std::vector<HandedOver> handed_ ABSL_GUARDED_BY(handed_mu_);
  bool stopping_ ABSL_GUARDED_BY(handed_mu_) = false;
  std::unique_ptr<std::thread> watcher_ ABSL_GUARDED_BY(handed_mu_);
  std::atomic<size_t> handed_count_{0};
};

// How often the pool checks whether importers let go of handed-over files.
inline constexpr absl::Duration kHandOverPollInterval = absl::Milliseconds(100);

}  // namespace materializer::memory

#endif  // MATERIALIZER_SERVER_MEMORY_POOL_H_
