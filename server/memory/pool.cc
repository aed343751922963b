#include "server/memory/pool.h"

#include <sys/file.h>
#include <unistd.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"
#include "server/common/units.h"

namespace materializer::memory {
namespace {

void UpdatePeak(Usage& usage) {
  usage.peak_bytes = std::max(usage.peak_bytes, HeldBytes(usage));
}

// Whether another open file holds a flock on `fd`'s file: an exclusive
// lock of our own is refused while any importer holds its shared one. (On
// success we keep the exclusive lock; the descriptor is about to close.)
bool LockedElsewhere(int fd) {
  return flock(fd, LOCK_EX | LOCK_NB) != 0;
}

std::string Figure(uint64_t bytes) {
  return absl::StrCat(FormatBytes(bytes), " (", bytes, " bytes)");
}

}  // namespace

// --- Allocation -------------------------------------------------------------

Allocation& Allocation::operator=(Allocation&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->Free(client_, device_, bytes_);
    pool_ = std::exchange(other.pool_, nullptr);
    client_ = std::move(other.client_);
    device_ = other.device_;
    bytes_ = other.bytes_;
  }
  return *this;
}

Allocation::~Allocation() {
  if (pool_ != nullptr) pool_->Free(client_, device_, bytes_);
}

void Allocation::HandOver(std::vector<int> fds) && {
  if (pool_ == nullptr) {
    for (int fd : fds) close(fd);
    return;
  }
  std::exchange(pool_, nullptr)->HandOver(client_, device_, bytes_,
                                          std::move(fds));
}

// --- Reservation ------------------------------------------------------------

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->Unreserve(client_, device_, bytes_);
    pool_ = std::exchange(other.pool_, nullptr);
    client_ = std::move(other.client_);
    device_ = other.device_;
    bytes_ = other.bytes_;
  }
  return *this;
}

Reservation::~Reservation() {
  if (pool_ != nullptr) pool_->Unreserve(client_, device_, bytes_);
}

Allocation Reservation::Commit() && {
  Allocation allocation;
  if (pool_ == nullptr) return allocation;
  pool_->CommitReservation(client_, device_, bytes_);
  allocation.pool_ = std::exchange(pool_, nullptr);
  allocation.client_ = std::move(client_);
  allocation.device_ = device_;
  allocation.bytes_ = bytes_;
  return allocation;
}

const DeviceConfig& Reservation::device() const {
  return pool_->devices()[device_];
}

// --- DevicePool -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(
    std::vector<DeviceConfig> devices, QuotaBook quotas,
    DriverAdmission driver) {
  if (devices.empty()) {
    return absl::InvalidArgumentError("the device pool needs a device");
  }
  absl::flat_hash_set<std::string> names;
  for (const DeviceConfig& device : devices) {
    if (!names.insert(device.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("device \"", device.name, "\" is listed twice"));
    }
  }
  return std::unique_ptr<DevicePool>(
      new DevicePool(std::move(devices), std::move(quotas), driver));
}

DevicePool::DevicePool(std::vector<DeviceConfig> devices, QuotaBook quotas,
                       DriverAdmission driver)
    : devices_(std::move(devices)),
      quotas_(std::move(quotas)),
      driver_(driver),
      device_usage_(devices_.size()) {}

DevicePool::DriverFree DevicePool::SampleDriver() const {
  DriverFree free(devices_.size());
  if (driver_.driver == nullptr) return free;
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (!driver_.driver->Covers(devices_[i])) continue;
    // A driver that cannot answer leaves the ledger to decide alone.
    absl::StatusOr<GpuMemorySample> sample =
        driver_.driver->Sample(devices_[i], /*with_processes=*/false);
    if (sample.ok()) free[i] = sample->free_bytes;
  }
  return free;
}

uint64_t DevicePool::DriverRoomLocked(int index,
                                      const DriverFree& driver) const {
  if (!driver[index].has_value()) return kNoByteLimit;
  const uint64_t free_bytes = *driver[index];
  uint64_t room = free_bytes > driver_.headroom_bytes
                      ? free_bytes - driver_.headroom_bytes
                      : 0;
  // Reserved bytes are not allocated yet, so the driver still counts them
  // as free.
  const uint64_t pending = device_usage_[index].reserved_bytes;
  return room > pending ? room - pending : 0;
}

uint64_t DevicePool::FreeBytesLocked(int index) const {
  const uint64_t used = HeldBytes(device_usage_[index]);
  const uint64_t capacity = devices_[index].capacity_bytes;
  return used >= capacity ? 0 : capacity - used;
}

uint64_t DevicePool::FreeBytes(int index) const {
  absl::ReaderMutexLock lock(&mu_);
  return FreeBytesLocked(index);
}

uint64_t DevicePool::AvailableLocked(absl::string_view client, int index,
                                     const DriverFree& driver) const {
  const Quota& quota = quotas_.For(client);
  Usage on_device;
  Usage total;
  if (auto it = clients_.find(client); it != clients_.end()) {
    on_device = it->second.per_device[index];
    total = it->second.total;
  }
  auto left = [](uint64_t limit, const Usage& usage) {
    const uint64_t used = HeldBytes(usage);
    return used >= limit ? 0 : limit - used;
  };
  return std::min({FreeBytesLocked(index), DriverRoomLocked(index, driver),
                   left(quota.BytesOn(devices_[index].name), on_device),
                   left(quota.total_bytes, total)});
}

uint64_t DevicePool::AvailableTo(absl::string_view client, int index) const {
  const DriverFree driver = SampleDriver();
  absl::ReaderMutexLock lock(&mu_);
  return AvailableLocked(client, index, driver);
}

std::string DevicePool::ShortfallLocked(absl::string_view client, int index,
                                        uint64_t bytes,
                                        const DriverFree& driver) const {
  const Quota& quota = quotas_.For(client);
  const DeviceConfig& device = devices_[index];
  Usage on_device;
  Usage total;
  if (auto it = clients_.find(client); it != clients_.end()) {
    on_device = it->second.per_device[index];
    total = it->second.total;
  }
  if (total.handles >= quota.handles) {
    return absl::StrCat("client \"", client, "\" holds ", total.handles,
                        " handles; its quota is ", quota.handles);
  }
  const uint64_t free_bytes = FreeBytesLocked(index);
  if (free_bytes < bytes) {
    const uint64_t handed = device_usage_[index].handed_over_bytes;
    return absl::StrCat(
        "the model needs ", Figure(bytes), " but only ", Figure(free_bytes),
        " of ", device.name, "'s ", Figure(device.capacity_bytes), " is free",
        handed > 0 ? absl::StrCat(" (", Figure(handed),
                                  " of released handles are still mapped by "
                                  "the processes they were handed over to)")
                   : "");
  }
  if (const uint64_t room = DriverRoomLocked(index, driver); room < bytes) {
    const uint64_t pending = device_usage_[index].reserved_bytes;
    return absl::StrCat(
        "the model needs ", Figure(bytes), " but the GPU driver reports only ",
        Figure(*driver[index]), " free on ", device.name, " (",
        Figure(driver_.headroom_bytes), " of it kept as headroom",
        pending > 0 ? absl::StrCat(", ", Figure(pending),
                                   " reserved for materializations in flight")
                    : "",
        "); the rest of the device is held outside this server's ledger, "
        "by other processes (GetStats lists them to admins)");
  }
  const uint64_t device_quota = quota.BytesOn(device.name);
  const uint64_t on_device_used = HeldBytes(on_device);
  if (device_quota != kNoByteLimit && on_device_used + bytes > device_quota) {
    return absl::StrCat("the model needs ", Figure(bytes), " but client \"",
                        client, "\" already holds ", Figure(on_device_used),
                        " of its ", Figure(device_quota), " quota on ",
                        device.name);
  }
  const uint64_t total_used = HeldBytes(total);
  if (quota.total_bytes != kNoByteLimit &&
      total_used + bytes > quota.total_bytes) {
    return absl::StrCat(
        "the model needs ", Figure(bytes), " but client \"", client,
        "\" already holds ", Figure(total_used), " of its ",
        Figure(quota.total_bytes), " total quota",
        total.handed_over_bytes > 0
            ? absl::StrCat(" (", Figure(total.handed_over_bytes),
                           " of them in released handles its processes "
                           "still map)")
            : "");
  }
  return "";
}

absl::StatusOr<int> DevicePool::ResolveLocked(absl::string_view client,
                                              absl::string_view placement,
                                              uint64_t bytes,
                                              const DriverFree& driver) const {
  const int n = static_cast<int>(devices_.size());
  if (placement.empty() || placement == "auto") {
    int best = -1;
    uint64_t best_room = 0;
    for (int i = 0; i < n; ++i) {
      if (!ShortfallLocked(client, i, bytes, driver).empty()) continue;
      const uint64_t room = AvailableLocked(client, i, driver);
      if (best < 0 || room < best_room) {
        best = i;
        best_room = room;
      }
    }
    if (best >= 0) return best;
    std::vector<std::string> reasons;
    for (int i = 0; i < n; ++i) {
      reasons.push_back(absl::StrCat(
          devices_[i].name, ": ", ShortfallLocked(client, i, bytes, driver)));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "placement \"auto\": no device can take ", Figure(bytes), " for \"",
        client, "\" now (", absl::StrJoin(reasons, "; "), ")"));
  }
  for (int i = 0; i < n; ++i) {
    if (devices_[i].name != placement) continue;
    if (std::string shortfall = ShortfallLocked(client, i, bytes, driver);
        !shortfall.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("placement ", Quote(placement), ": ", shortfall));
    }
    return i;
  }
  std::vector<std::string> names;
  for (const DeviceConfig& device : devices_) names.push_back(device.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "placement.device: ", Quote(placement),
      " is not a device of this server; devices: auto, ",
      absl::StrJoin(names, ", ")));
}

absl::StatusOr<int> DevicePool::Resolve(absl::string_view client,
                                        absl::string_view placement,
                                        uint64_t bytes) const {
  const DriverFree driver = SampleDriver();
  absl::ReaderMutexLock lock(&mu_);
  return ResolveLocked(client, placement, bytes, driver);
}

template <typename Change>
void DevicePool::ApplyLocked(const std::string& client, int device,
                             Change change) {
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    it = clients_.emplace(client, ClientLedger{}).first;
    it->second.per_device.resize(devices_.size());
  }
  for (Usage* usage : {&device_usage_[device], &it->second.per_device[device],
                       &it->second.total, &total_}) {
    change(*usage);
    UpdatePeak(*usage);
  }
}

Reservation DevicePool::ReserveLocked(absl::string_view client, int device,
                                      uint64_t bytes) {
  Reservation reservation;
  reservation.pool_ = this;
  reservation.client_ = std::string(client);
  reservation.device_ = device;
  reservation.bytes_ = bytes;
  ApplyLocked(reservation.client_, device, [bytes](Usage& usage) {
    usage.reserved_bytes += bytes;
    usage.handles += 1;
  });
  return reservation;
}

absl::StatusOr<Reservation> DevicePool::Reserve(absl::string_view client,
                                                absl::string_view placement,
                                                uint64_t bytes) {
  if (handed_count_.load() > 0) SweepHandedOver();
  const DriverFree driver = SampleDriver();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int> device = ResolveLocked(client, placement, bytes, driver);
  if (!device.ok()) return device.status();
  return ReserveLocked(client, *device, bytes);
}

absl::StatusOr<DevicePool::SplitPlan> DevicePool::PlanSplitLocked(
    absl::string_view client, const SplitRequest& request,
    const DriverFree& driver) const {
  std::vector<int> order;
  if (request.devices.empty()) {
    for (int i = 0; i < static_cast<int>(devices_.size()); ++i) {
      order.push_back(i);
    }
  } else {
    for (const std::string& name : request.devices) {
      auto it = std::find_if(devices_.begin(), devices_.end(),
                             [&](const DeviceConfig& d) { return d.name == name; });
      if (it == devices_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "placement.split.devices: ", Quote(name),
            " is not a device of this server"));
      }
      order.push_back(static_cast<int>(it - devices_.begin()));
    }
  }
  for (const auto& entry : request.max_memory) {
    // Not a structured binding: lambdas may capture those only from C++20
    // (clang refuses it in C++17; the fuzz build uses clang).
    const std::string& name = entry.first;
    if (std::none_of(order.begin(), order.end(),
                     [&](int i) { return devices_[i].name == name; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement.split.max_memory: ", Quote(name),
          " is not one of the devices the split uses"));
    }
  }
  const Quota& quota = quotas_.For(client);
  uint64_t total_left = kNoByteLimit;
  uint32_t handles_left = kNoHandleLimit;
  if (auto it = clients_.find(client); it != clients_.end()) {
    const Usage& total = it->second.total;
    const uint64_t used = HeldBytes(total);
    if (quota.total_bytes != kNoByteLimit) {
      total_left = used >= quota.total_bytes ? 0 : quota.total_bytes - used;
    }
    if (quota.handles != kNoHandleLimit) {
      handles_left = total.handles >= quota.handles ? 0 : quota.handles - total.handles;
    }
  } else {
    total_left = quota.total_bytes;
    handles_left = quota.handles;
  }
  // Room per device in fill order: free bytes within the client's quota
  // and the driver's free memory (AvailableLocked) and the request's cap.
  std::vector<uint64_t> room;
  for (int device : order) {
    uint64_t r = AvailableLocked(client, device, driver);
    if (auto it = request.max_memory.find(devices_[device].name);
        it != request.max_memory.end()) {
      r = std::min(r, it->second);
    }
    room.push_back(r);
  }
  SplitPlan plan;
  size_t current = 0;  // position in `order`
  uint64_t used_here = 0;
  int part = -1;
  for (size_t u = 0; u < request.unit_bytes.size(); ++u) {
    const uint64_t bytes = request.unit_bytes[u];
    while (current < order.size() && used_here + bytes > room[current]) {
      ++current;
      used_here = 0;
    }
    if (current == order.size() || bytes > total_left) {
      std::vector<std::string> rooms;
      for (size_t k = 0; k < order.size(); ++k) {
        rooms.push_back(absl::StrCat(devices_[order[k]].name, " ",
                                     Figure(room[k])));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "placement \"split\": ",
          u < request.unit_names.size()
              ? absl::StrCat("\"", request.unit_names[u], "\"")
              : absl::StrCat("unit ", u),
          " needs ", Figure(bytes),
          bytes > total_left
              ? absl::StrCat(" but client \"", client, "\" has only ",
                             Figure(total_left), " of its total quota left")
              : absl::StrCat(" and fits on no remaining device (room per "
                             "device, after caps and quota: ",
                             absl::StrJoin(rooms, ", "), ")")));
    }
    if (part < 0 || plan.part_devices[part] != order[current]) {
      plan.part_devices.push_back(order[current]);
      plan.part_bytes.push_back(0);
      part = static_cast<int>(plan.part_devices.size()) - 1;
    }
    plan.part_of_unit.push_back(part);
    plan.part_bytes[part] += bytes;
    used_here += bytes;
    total_left -= bytes;
  }
  if (plan.part_devices.empty()) {  // no bytes at all: one empty part
    plan.part_devices.push_back(order.empty() ? 0 : order.front());
    plan.part_bytes.push_back(0);
  }
  if (plan.part_devices.size() > handles_left) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "placement \"split\": the handle would count on ",
        plan.part_devices.size(), " devices but client \"", client,
        "\" has ", handles_left, " handle(s) of its quota left"));
  }
  return plan;
}

absl::StatusOr<DevicePool::SplitPlan> DevicePool::PlanSplit(
    absl::string_view client, const SplitRequest& request) const {
  const DriverFree driver = SampleDriver();
  absl::ReaderMutexLock lock(&mu_);
  return PlanSplitLocked(client, request, driver);
}

absl::StatusOr<DevicePool::SplitReservation> DevicePool::ReserveSplit(
    absl::string_view client, const SplitRequest& request) {
  if (handed_count_.load() > 0) SweepHandedOver();
  const DriverFree driver = SampleDriver();
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SplitPlan plan, PlanSplitLocked(client, request, driver));
  SplitReservation out;
  for (size_t p = 0; p < plan.part_devices.size(); ++p) {
    out.parts.push_back(ReserveLocked(client, plan.part_devices[p],
                                      plan.part_bytes[p]));
  }
  out.plan = std::move(plan);
  return out;
}

void DevicePool::Unreserve(const std::string& client, int device,
                           uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ApplyLocked(client, device, [bytes](Usage& usage) {
    usage.reserved_bytes -= bytes;
    usage.handles -= 1;
  });
}

void DevicePool::CommitReservation(const std::string& client, int device,
                                   uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ApplyLocked(client, device, [bytes](Usage& usage) {
    usage.reserved_bytes -= bytes;
    usage.in_use_bytes += bytes;
  });
}

void DevicePool::Free(const std::string& client, int device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ApplyLocked(client, device, [bytes](Usage& usage) {
    usage.in_use_bytes -= bytes;
    usage.handles -= 1;
  });
}

void DevicePool::HandOver(const std::string& client, int device,
                          uint64_t bytes, std::vector<int> fds) {
  {
    absl::MutexLock lock(&mu_);
    ApplyLocked(client, device, [bytes](Usage& usage) {
      usage.in_use_bytes -= bytes;
      usage.handed_over_bytes += bytes;
      usage.handles -= 1;
    });
  }
  absl::MutexLock lock(&handed_mu_);
  handed_.push_back({client, device, bytes, std::move(fds)});
  handed_count_.store(handed_.size());
  if (watcher_ == nullptr && !stopping_) {
    watcher_ = std::make_unique<std::thread>([this] { WatchHandedOver(); });
  }
}

void DevicePool::SweepHandedOver() {
  std::vector<HandedOver> done;
  {
    absl::MutexLock lock(&handed_mu_);
    for (size_t i = 0; i < handed_.size();) {
      const std::vector<int>& fds = handed_[i].fds;
      if (std::any_of(fds.begin(), fds.end(), LockedElsewhere)) {
        ++i;
        continue;
      }
      done.push_back(std::move(handed_[i]));
      handed_[i] = std::move(handed_.back());
      handed_.pop_back();
    }
    handed_count_.store(handed_.size());
  }
  for (HandedOver& h : done) {
    // Closing the last descriptor of an unlinked file frees its pages.
    for (int fd : h.fds) close(fd);
    absl::MutexLock lock(&mu_);
    ApplyLocked(h.client, h.device, [&h](Usage& usage) {
      usage.handed_over_bytes -= h.bytes;
    });
  }
}

void DevicePool::WatchHandedOver() {
  while (true) {
    {
      absl::MutexLock lock(&handed_mu_);
      handed_mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                                  kHandOverPollInterval);
      if (stopping_) return;
    }
    SweepHandedOver();
  }
}

DevicePool::~DevicePool() {
  std::unique_ptr<std::thread> watcher;
  {
    absl::MutexLock lock(&handed_mu_);
    stopping_ = true;
    watcher = std::move(watcher_);
  }
  if (watcher != nullptr) watcher->join();
  for (HandedOver& h : handed_) {
    for (int fd : h.fds) close(fd);
  }
}

PoolSnapshot DevicePool::Snapshot() const {
  absl::ReaderMutexLock lock(&mu_);
  PoolSnapshot snapshot;
  for (size_t i = 0; i < devices_.size(); ++i) {
    snapshot.devices.push_back({devices_[i], device_usage_[i]});
  }
  for (const auto& [client, ledger] : clients_) {
    const Usage& usage = ledger.total;
    if (HeldBytes(usage) == 0 && usage.handles == 0) {
      continue;
    }
    snapshot.clients.emplace(client, ClientUsage{usage, ledger.per_device});
  }
  snapshot.total = total_;
  return snapshot;
}

}  // namespace materializer::memory
