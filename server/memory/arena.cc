#include "server/memory/arena.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <thread>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/strides.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/common/log.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/common/units.h"
#include "server/memory/arena_views.h"
#include "server/memory/shm_file.h"
#include "server/spec/torch_dtype.h"

namespace materializer::memory {
namespace {

// Every init thread helps make an arena resident.
int PopulateThreads() { return std::max(1, at::get_num_threads()); }

// Fresh anonymous pages: zero-filled by the kernel, page aligned, and
// returned to the system on release (munmap), so a freed handle leaves no
// resident memory behind.
absl::StatusOr<at::Tensor> AllocateHostStorage(uint64_t bytes,
                                               std::byte** data) {
  if (bytes == 0) {
    at::Tensor storage;
    RETURN_IF_ERROR(GuardTorch("allocating an empty arena", [&] {
      storage = at::empty({0}, at::TensorOptions().dtype(at::kByte));
    }));
    *data = nullptr;
    return storage;
  }
  void* pages = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (pages == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot map ", FormatBytes(bytes), " of host memory: ",
        std::strerror(errno)));
  }
  absl::StatusOr<bool> populated = PopulateForWrite(
      static_cast<std::byte*>(pages), bytes, PopulateThreads(), "host memory");
  if (!populated.ok()) {
    munmap(pages, bytes);
    return populated.status();
  }
  // No MADV_HUGEPAGE: on a 2-core VM, llama-1b's init took 1.3-15.9 s
  // (median 10.3) with it and 2.2-2.4 s without, in one same-run A/B of 6
  // repetitions: under THP defrag "madvise" each fault in an advised range
  // waits for the kernel to find a free 2 MiB page (docs/architecture.md,
  // "Host memory").
  at::Tensor storage;
  const absl::Status status = GuardTorch("wrapping the arena", [&] {
    storage = at::from_blob(
        pages, {static_cast<int64_t>(bytes)},
        [bytes](void* p) { munmap(p, bytes); },
        at::TensorOptions().dtype(at::kByte));
  });
  if (!status.ok()) {
    munmap(pages, bytes);
    return status;
  }
  *data = static_cast<std::byte*>(pages);
  return storage;
}


// ---------------------------------------------------------------------------
// The CUDA runtime and driver, looked up rather than linked (as in
// device.cc), so the same binary runs where there is no CUDA.
// ---------------------------------------------------------------------------

struct CudaApi {
  using Int = int (*)(int);
  using IntPtr = int (*)(int*);
  using Malloc = int (*)(void**, size_t);
  using Free = int (*)(void*);
  using HostAlloc = int (*)(void**, size_t, unsigned);
  using StreamCreate = int (*)(void**, unsigned);
  using StreamDestroy = int (*)(void*);
  using MemcpyAsync = int (*)(void*, const void*, size_t, int, void*);
  using EventCreate = int (*)(void**, unsigned);
  using EventRecord = int (*)(void*, void*);
  using EventSync = int (*)(void*);
  using EventDestroy = int (*)(void*);
  using IpcGetMemHandle = int (*)(void* handle, void* ptr);
  using DeviceGet = int (*)(int*, int);
  using DeviceGetUuid = int (*)(void* uuid16, int device);

  Int set_device = nullptr;
  IntPtr get_device = nullptr;
  Malloc malloc = nullptr;
  Free free = nullptr;
  HostAlloc host_alloc = nullptr;
  Free free_host = nullptr;
  StreamCreate stream_create = nullptr;
  StreamDestroy stream_destroy = nullptr;
  MemcpyAsync memcpy_async = nullptr;
  EventCreate event_create = nullptr;
  EventRecord event_record = nullptr;
  EventSync event_synchronize = nullptr;
  EventDestroy event_destroy = nullptr;
  IpcGetMemHandle ipc_get_mem_handle = nullptr;
  // Driver API (libcuda), for device UUIDs.
  DeviceGet device_get = nullptr;
  DeviceGetUuid device_get_uuid = nullptr;

  bool runtime_ok() const {
    return set_device && get_device && malloc && free && host_alloc &&
           free_host && stream_create && stream_destroy && memcpy_async &&
           event_create && event_record && event_synchronize &&
           event_destroy && ipc_get_mem_handle;
  }
};

// The runtime LibTorch loaded, or nullptr. Loaded once; never unloaded.
const CudaApi* Cuda() {
  static const CudaApi* api = [] () -> const CudaApi* {
    void* runtime = nullptr;
    for (const char* name :
         {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      runtime = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      if (runtime != nullptr) break;
    }
    if (runtime == nullptr) return nullptr;
    auto* out = new CudaApi;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
          dlsym(runtime, name));
    };
    sym(&out->set_device, "cudaSetDevice");
    sym(&out->get_device, "cudaGetDevice");
    sym(&out->malloc, "cudaMalloc");
    sym(&out->free, "cudaFree");
    sym(&out->host_alloc, "cudaHostAlloc");
    sym(&out->free_host, "cudaFreeHost");
    sym(&out->stream_create, "cudaStreamCreateWithFlags");
    sym(&out->stream_destroy, "cudaStreamDestroy");
    sym(&out->memcpy_async, "cudaMemcpyAsync");
    sym(&out->event_create, "cudaEventCreateWithFlags");
    sym(&out->event_record, "cudaEventRecord");
    sym(&out->event_synchronize, "cudaEventSynchronize");
    sym(&out->event_destroy, "cudaEventDestroy");
    sym(&out->ipc_get_mem_handle, "cudaIpcGetMemHandle");
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver != nullptr) {
      out->device_get =
          reinterpret_cast<CudaApi::DeviceGet>(dlsym(driver, "cuDeviceGet"));
      out->device_get_uuid = reinterpret_cast<CudaApi::DeviceGetUuid>(
          dlsym(driver, "cuDeviceGetUuid_v2"));
      if (out->device_get_uuid == nullptr) {
        out->device_get_uuid = reinterpret_cast<CudaApi::DeviceGetUuid>(
            dlsym(driver, "cuDeviceGetUuid"));
      }
    }
    if (!out->runtime_ok()) {
      delete out;
      return nullptr;
    }
    return out;
  }();
  return api;
}

constexpr int kCudaMemcpyDeviceToHost = 2;
constexpr unsigned kCudaStreamNonBlocking = 1;
constexpr unsigned kCudaEventDisableTiming = 2;

// Runs `body` with `ordinal` as the calling thread's current device.
template <typename Body>
int OnDevice(const CudaApi& cuda, int ordinal, Body body) {
  int previous = 0;
  cuda.get_device(&previous);
  int error = cuda.set_device(ordinal);
  if (error == 0) error = body();
  cuda.set_device(previous);
  return error;
}

absl::Status CudaError(absl::string_view what, int error) {
  return absl::InternalError(
      absl::StrCat(what, " failed: CUDA error ", error));
}

// ---------------------------------------------------------------------------
// Shared-memory arenas.
// ---------------------------------------------------------------------------

uint64_t RoundUpToPage(uint64_t bytes) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// A shared-memory arena of `bytes` zero bytes: the pool's resident slabs
// first (options.shared_memory_pool), then one fresh file for the rest,
// all mapped shared into one contiguous range (mremap moves a slab's
// mapping, page tables included, so its pages stay resident). The files
// are the arena's segments, in order; the export lists them. Pages are
// resident before this returns (PopulateForWrite, else posix_fallocate),
// so a full /dev/shm is an error now rather than a SIGBUS when init first
// touches a page.
absl::StatusOr<at::Tensor> AllocateSharedHostStorage(
    uint64_t bytes, const ArenaOptions& options, std::byte** data,
    std::vector<SharedMemorySegment>* segments,
    std::vector<int>* segment_fds) {
  SharedMemoryPool* pool = options.shared_memory_pool;
  const std::string& dir = pool != nullptr ? pool->dir()
                                           : options.shared_memory_dir;
  std::vector<SharedMemorySlab> slabs;
  if (pool != nullptr && bytes > 0) {
    slabs = pool->Take(pool->SlabsFor(bytes));
  }
  std::vector<SharedMemoryFile> files;  // owned here until success
  const uint64_t mapped = RoundUpToPage(bytes);
  void* region = nullptr;
  auto fail = [&](absl::Status status) {
    if (region != nullptr) munmap(region, mapped);
    for (SharedMemorySlab& slab : slabs) ReleaseSlab(slab);
    for (SharedMemoryFile& file : files) CloseSharedMemoryFile(file);
    return status;
  };
  if (bytes > 0) {
    // Reserve the range; each segment's mapping replaces its part.
    // On a 2 MiB boundary: every segment starts at a multiple of 2 MiB
    // (slabs are 128 MiB), so a huge-page tmpfs maps it with 2 MiB pages.
    region = ReserveAddressSpace(mapped);
    if (region == nullptr) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", FormatBytes(bytes), " of address space: ",
          std::strerror(errno))));
    }
  }
  auto* base = static_cast<std::byte*>(region);
  uint64_t offset = 0;
  for (SharedMemorySlab& slab : slabs) {
    const uint64_t length = std::min(slab.bytes, bytes - offset);
    const uint64_t length_mapped = RoundUpToPage(length);
    if (mremap(slab.pages, slab.bytes, length_mapped,
               MREMAP_MAYMOVE | MREMAP_FIXED, base + offset) == MAP_FAILED) {
      return fail(absl::InternalError(absl::StrCat(
          "moving a shared-memory slab into an arena: ",
          std::strerror(errno))));
    }
    slab.pages = nullptr;  // the region holds the mapping now
    // A cut slab gives its tail pages back to the kernel.
    if (length < slab.bytes &&
        ftruncate(slab.fd, static_cast<off_t>(length)) != 0) {
      return fail(absl::InternalError(absl::StrCat(
          "cutting ", slab.path, " to ", length, " bytes: ",
          std::strerror(errno))));
    }
    files.push_back(SharedMemoryFile{slab.path, slab.fd});
    slab.fd = -1;
    slab.path.clear();
    segments->push_back(SharedMemorySegment{files.back().path, offset, length});
    offset += length;
  }
  slabs.clear();
  if (offset < bytes || bytes == 0) {
    // The rest (all of it without a pool): a fresh file, populated here.
    const uint64_t length = bytes - offset;
    absl::StatusOr<SharedMemoryFile> file = CreateSharedMemoryFile(dir, length);
    if (!file.ok()) return fail(file.status());
    files.push_back(*file);
    segments->push_back(SharedMemorySegment{file->path, offset, length});
    if (length > 0) {
      if (mmap(base + offset, RoundUpToPage(length), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_FIXED, file->fd, 0) == MAP_FAILED) {
        return fail(absl::ResourceExhaustedError(absl::StrCat(
            "cannot map ", FormatBytes(length), " of shared memory: ",
            std::strerror(errno))));
      }
      // Populated through the mapping rather than by posix_fallocate: tmpfs
      // fallocate runs on one thread under the inode lock and leaves every
      // page to be cleared at its first fault anyway.
      absl::StatusOr<bool> populated =
          PopulateForWrite(base + offset, length, PopulateThreads(),
                           absl::StrCat("shared memory in ", dir));
      if (!populated.ok()) return fail(populated.status());
      if (!*populated) {
        const int error =
            posix_fallocate(file->fd, 0, static_cast<off_t>(length));
        if (error != 0) {
          return fail(absl::ResourceExhaustedError(absl::StrCat(
              "cannot allocate ", FormatBytes(length),
              " of shared memory in ", dir, ": ", std::strerror(error))));
        }
      }
    }
  }
  at::Tensor storage;
  const absl::Status status = GuardTorch("wrapping the arena", [&] {
    if (region == nullptr) {
      storage = at::empty({0}, at::TensorOptions().dtype(at::kByte));
    } else {
      storage = at::from_blob(
          region, {static_cast<int64_t>(bytes)},
          [mapped](void* p) { munmap(p, mapped); },
          at::TensorOptions().dtype(at::kByte));
    }
  });
  if (!status.ok()) return fail(status);
  for (const SharedMemoryFile& file : files) segment_fds->push_back(file.fd);
  *data = base;
  return storage;
}

// A CUDA allocation of its own (not a block of LibTorch's caching
// allocator, whose segments may hold other handles' tensors), so that its
// IPC handle exposes this arena and nothing else.
absl::StatusOr<at::Tensor> AllocateOwnCudaStorage(const CudaApi& cuda,
                                                  int ordinal, uint64_t bytes,
                                                  void** data) {
  void* pointer = nullptr;
  const int error = OnDevice(cuda, ordinal, [&] {
    return cuda.malloc(&pointer, static_cast<size_t>(bytes));
  });
  if (error != 0 || pointer == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cudaMalloc of ", FormatBytes(bytes), " on cuda:", ordinal,
        " failed: CUDA error ", error));
  }
  at::Tensor storage;
  const CudaApi* api = &cuda;
  const absl::Status status = GuardTorch("wrapping the CUDA arena", [&] {
    storage = at::from_blob(
        pointer, {static_cast<int64_t>(bytes)},
        [api, ordinal](void* p) {
          OnDevice(*api, ordinal, [&] { return api->free(p); });
        },
        at::TensorOptions().dtype(at::kByte).device(
            at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ordinal))));
  });
  if (!status.ok()) {
    OnDevice(cuda, ordinal, [&] { return cuda.free(pointer); });
    return status;
  }
  *data = pointer;
  return storage;
}

absl::StatusOr<at::Tensor> AllocateCudaStorage(int ordinal, uint64_t bytes) {
  at::Tensor storage;
  RETURN_IF_ERROR(GuardTorch(
      absl::StrCat("allocating ", FormatBytes(bytes), " on cuda:", ordinal),
      [&] {
        storage = at::empty({static_cast<int64_t>(bytes)},
                            at::TensorOptions()
                                .dtype(at::kByte)
                                .device(at::Device(at::kCUDA, ordinal)));
      }));
  return storage;
}

}  // namespace

Arena::Arena(DeviceConfig device, uint64_t bytes)
    : device_(std::move(device)),
      bytes_(bytes),
      tensors_(std::make_unique<ArenaTensors>()) {}

Arena::~Arena() {
  UnlinkSharedMemory();
  // The views and the storage go first: the mapping (and a CUDA
  // allocation) is freed before the descriptors and the ledger entry.
  tensors_.reset();
  // An importer that maps the files holds a shared flock on them for as
  // long as its mapping lives (the Python SDK does): the pages outlive the
  // handle, still charged to this process's memory cgroup, so they stay in
  // the ledger as handed over until it lets go (DevicePool::HandOver).
  // Converting our own shared lock to an exclusive one fails while anyone
  // else holds one.
  const bool imported = std::any_of(
      shm_fds_.begin(), shm_fds_.end(),
      [](int fd) { return flock(fd, LOCK_EX | LOCK_NB) != 0; });
  if (imported) {
    std::move(allocation_).HandOver(std::exchange(shm_fds_, {}));
    return;
  }
  for (int fd : shm_fds_) close(fd);
}

void Arena::UnlinkSharedMemory() const {
  if (shm_segments_.empty() || shm_unlinked_.exchange(true)) return;
  for (const SharedMemorySegment& segment : shm_segments_) {
    if (unlink(segment.path.c_str()) != 0 && errno != ENOENT) {
      MLOG(WARNING) << "unlink " << segment.path << ": "
                    << std::strerror(errno);
    }
  }
}

absl::StatusOr<CudaIpcInfo> Arena::ExportCudaIpc() const {
  if (device_.kind != DeviceKind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the arena is on ", device_.name, ", not a CUDA device"));
  }
  const CudaApi* cuda = Cuda();
  if (cuda == nullptr || cuda_data_ == nullptr) {
    return absl::FailedPreconditionError(
        "the arena is not an allocation of its own (the CUDA runtime was not "
        "found when it was allocated), so it cannot be exported");
  }
  CudaIpcInfo info;
  info.device_ordinal = device_.ordinal;
  const int error = OnDevice(*cuda, device_.ordinal, [&] {
    return cuda->ipc_get_mem_handle(info.ipc_handle.data(), cuda_data_);
  });
  if (error != 0) return CudaError("cudaIpcGetMemHandle", error);
  ASSIGN_OR_RETURN(info.device_uuid, CudaDeviceUuid(device_.ordinal));
  info.base_offset = 0;  // the allocation is the arena
  return info;
}

absl::StatusOr<std::string> CudaDeviceUuid(int ordinal) {
  const CudaApi* cuda = Cuda();
  if (cuda == nullptr || cuda->device_get == nullptr ||
      cuda->device_get_uuid == nullptr) {
    return absl::UnavailableError("the CUDA driver is not loaded");
  }
  int device = 0;
  int error = cuda->device_get(&device, ordinal);
  unsigned char uuid[16] = {};
  if (error == 0) error = cuda->device_get_uuid(uuid, device);
  if (error != 0) return CudaError("cuDeviceGetUuid", error);
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppend(&out, absl::Hex(uuid[i], absl::kZeroPad2));
  }
  return out;
}

size_t Arena::num_tensors() const { return tensors_->views.size(); }

absl::StatusOr<std::unique_ptr<Arena>> Arena::Allocate(
    Reservation reservation, const std::vector<spec::TensorDesc>& tensors,
    const spec::Layout& layout, const ArenaOptions& options) {
  if (reservation.bytes() < layout.arena_bytes ||
      layout.offsets.size() != tensors.size()) {
    return absl::InternalError(
        absl::StrCat("arena of ", layout.arena_bytes,
                     " bytes needs a reservation that covers it; have ",
                     reservation.bytes()));
  }
  const DeviceConfig& device = reservation.device();
  std::unique_ptr<Arena> arena(new Arena(device, layout.arena_bytes));

  at::Tensor storage;
  if (device.kind == DeviceKind::kCpu && options.shared_memory) {
    ASSIGN_OR_RETURN(storage, AllocateSharedHostStorage(
                                  layout.arena_bytes, options,
                                  &arena->host_data_, &arena->shm_segments_,
                                  &arena->shm_fds_));
  } else if (device.kind == DeviceKind::kCpu) {
    ASSIGN_OR_RETURN(storage,
                     AllocateHostStorage(layout.arena_bytes, &arena->host_data_));
  } else if (const CudaApi* cuda = Cuda();
             cuda != nullptr && layout.arena_bytes > 0) {
    ASSIGN_OR_RETURN(storage,
                     AllocateOwnCudaStorage(*cuda, device.ordinal,
                                            layout.arena_bytes,
                                            &arena->cuda_data_));
  } else {
    ASSIGN_OR_RETURN(storage,
                     AllocateCudaStorage(device.ordinal, layout.arena_bytes));
  }

  // to_empty: each meta tensor becomes a tensor of the same shape and dtype
  // on the device, here backed by the arena instead of its own allocation.
  std::vector<at::Tensor>& views = arena->tensors_->views;
  views.reserve(tensors.size());
  RETURN_IF_ERROR(GuardTorch("creating tensor views", [&] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const spec::TensorDesc& t = tensors[i];
      const at::ScalarType type = spec::ToScalarType(t.dtype);
      at::Tensor view =
          at::empty({0}, storage.options().dtype(type));
      const int64_t itemsize = static_cast<int64_t>(spec::ItemSize(t.dtype));
      view.set_(storage.storage(),
                static_cast<int64_t>(layout.offsets[i]) / itemsize, t.shape,
                c10::contiguous_strides(t.shape));
      views.push_back(std::move(view));
    }
  }));
  arena->tensors_->storage = std::move(storage);
  arena->allocation_ = std::move(reservation).Commit();
  return arena;
}

std::unique_ptr<Arena> Arena::Combine(
    std::vector<std::unique_ptr<Arena>> parts, std::vector<uint64_t> bases,
    const std::vector<int>& part_of_tensor,
    const std::vector<int>& local_index) {
  uint64_t bytes = 0;
  for (const std::unique_ptr<Arena>& part : parts) bytes += part->bytes();
  std::unique_ptr<Arena> arena(new Arena(parts.front()->device(), bytes));
  std::vector<at::Tensor>& views = arena->tensors_->views;
  views.reserve(part_of_tensor.size());
  for (size_t i = 0; i < part_of_tensor.size(); ++i) {
    views.push_back(
        parts[part_of_tensor[i]]->tensors_->views[local_index[i]]);
  }
  arena->parts_ = std::move(parts);
  arena->part_bases_ = std::move(bases);
  return arena;
}

const DeviceConfig& Arena::DeviceAt(uint64_t offset) const {
  if (parts_.empty()) return device_;
  const size_t p = std::upper_bound(part_bases_.begin(), part_bases_.end(),
                                    offset) -
                   part_bases_.begin() - 1;
  return parts_[p]->device();
}

absl::Status Arena::CopyToHost(uint64_t offset, uint64_t length,
                               void* dst) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "arena range [", offset, ", ", offset + length, ") is outside its ",
        bytes_, " bytes"));
  }
  if (length == 0) return absl::OkStatus();
  if (!parts_.empty()) {  // part by part
    auto* out = static_cast<std::byte*>(dst);
    while (length > 0) {
      const size_t p =
          std::upper_bound(part_bases_.begin(), part_bases_.end(), offset) -
          part_bases_.begin() - 1;
      const uint64_t local = offset - part_bases_[p];
      const uint64_t n = std::min(length, parts_[p]->bytes() - local);
      RETURN_IF_ERROR(parts_[p]->CopyToHost(local, n, out));
      out += n;
      offset += n;
      length -= n;
    }
    return absl::OkStatus();
  }
  if (host_data_ != nullptr) {
    std::memcpy(dst, host_data_ + offset, length);
    return absl::OkStatus();
  }
  return GuardTorch("copying arena bytes to the host", [&] {
    at::Tensor out = at::from_blob(dst, {static_cast<int64_t>(length)},
                                   at::TensorOptions().dtype(at::kByte));
    out.copy_(tensors_->storage.narrow(0, static_cast<int64_t>(offset),
                                       static_cast<int64_t>(length)));
  });
}

// ---------------------------------------------------------------------------
// HostStaging
// ---------------------------------------------------------------------------

struct HostStaging::Impl {
  const CudaApi* cuda = nullptr;
  int ordinal = 0;
  const std::byte* device_data = nullptr;
  void* stream = nullptr;
  struct Buffer {
    void* host = nullptr;
    void* done = nullptr;  // event recorded after the copy
    bool in_flight = false;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  Buffer buffers[2];
  // The buffer a Prefetch filled or is filling, or -1.
  int prefetched = -1;

  // Starts the copy of [offset, offset + length) into buffers[b].
  int Start(int b, uint64_t offset, uint64_t length) {
    Buffer& buffer = buffers[b];
    buffer.offset = offset;
    buffer.length = length;
    buffer.in_flight = true;
    return OnDevice(*cuda, ordinal, [&] {
      int error = cuda->memcpy_async(buffer.host, device_data + offset,
                                     static_cast<size_t>(length),
                                     kCudaMemcpyDeviceToHost, stream);
      if (error == 0) error = cuda->event_record(buffer.done, stream);
      return error;
    });
  }

  int Wait(int b) {
    Buffer& buffer = buffers[b];
    if (!buffer.in_flight) return 0;
    buffer.in_flight = false;
    return cuda->event_synchronize(buffer.done);
  }

  ~Impl() {
    if (cuda == nullptr) return;
    for (int b = 0; b < 2; ++b) Wait(b);
    OnDevice(*cuda, ordinal, [&] {
      for (Buffer& buffer : buffers) {
        if (buffer.done != nullptr) cuda->event_destroy(buffer.done);
        if (buffer.host != nullptr) cuda->free_host(buffer.host);
      }
      if (stream != nullptr) cuda->stream_destroy(stream);
      return 0;
    });
  }
};

HostStaging::HostStaging(std::unique_ptr<Impl> impl, uint64_t buffer_bytes)
    : impl_(std::move(impl)), buffer_bytes_(buffer_bytes) {}

HostStaging::~HostStaging() = default;

absl::StatusOr<std::unique_ptr<HostStaging>> HostStaging::Create(
    const Arena& arena, uint64_t buffer_bytes) {
  const CudaApi* cuda = Cuda();
  if (arena.device().kind != DeviceKind::kCuda || cuda == nullptr ||
      arena.cuda_data_ == nullptr) {
    return absl::UnavailableError(
        "pinned staging needs a CUDA arena allocated through the CUDA "
        "runtime");
  }
  auto impl = std::make_unique<Impl>();
  impl->cuda = cuda;
  impl->ordinal = arena.device().ordinal;
  impl->device_data = static_cast<const std::byte*>(arena.cuda_data_);
  const int error = OnDevice(*cuda, impl->ordinal, [&] {
    int e = cuda->stream_create(&impl->stream, kCudaStreamNonBlocking);
    for (Impl::Buffer& buffer : impl->buffers) {
      if (e == 0) e = cuda->host_alloc(&buffer.host, buffer_bytes, 0);
      if (e == 0) e = cuda->event_create(&buffer.done, kCudaEventDisableTiming);
    }
    return e;
  });
  if (error != 0) return CudaError("creating pinned staging buffers", error);
  return std::unique_ptr<HostStaging>(
      new HostStaging(std::move(impl), buffer_bytes));
}

absl::Status HostStaging::Prefetch(uint64_t offset, uint64_t length) {
  if (length > buffer_bytes_ || length == 0) return absl::OkStatus();
  if (impl_->prefetched >= 0) {
    const Impl::Buffer& buffer = impl_->buffers[impl_->prefetched];
    if (buffer.offset <= offset &&
        offset + length <= buffer.offset + buffer.length) {
      return absl::OkStatus();  // already on its way
    }
    impl_->Wait(impl_->prefetched);  // stale: drop it
    impl_->prefetched = -1;
  }
  const int b = 0;
  const int error = impl_->Start(b, offset, length);
  if (error != 0) {
    impl_->buffers[b].in_flight = false;
    return CudaError("cudaMemcpyAsync", error);
  }
  impl_->prefetched = b;
  return absl::OkStatus();
}

absl::Status HostStaging::CopyOut(uint64_t offset, uint64_t length,
                                  void* dst) {
  if (length == 0) return absl::OkStatus();
  if (length > buffer_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging copies at most ", buffer_bytes_, " bytes, not ", length));
  }
  const int p = impl_->prefetched;
  if (p >= 0) {
    const Impl::Buffer& buffer = impl_->buffers[p];
    if (buffer.offset <= offset &&
        offset + length <= buffer.offset + buffer.length) {
      const int error = impl_->Wait(p);
      if (error != 0) return CudaError("waiting for a staged copy", error);
      std::memcpy(dst, static_cast<const std::byte*>(buffer.host) +
                           (offset - buffer.offset),
                  length);
      // Consumed up to its end: the buffer is free for the next prefetch.
      if (offset + length == buffer.offset + buffer.length) {
        impl_->prefetched = -1;
      }
      return absl::OkStatus();
    }
  }
  // Not prefetched: copy through the other buffer now.
  const int b = p == 0 ? 1 : 0;
  if (p < 0) impl_->Wait(0);
  int error = impl_->Start(b, offset, length);
  if (error == 0) error = impl_->Wait(b);
  if (error != 0) return CudaError("copying arena bytes to the host", error);
  std::memcpy(dst, impl_->buffers[b].host, length);
  return absl::OkStatus();
}

}  // namespace materializer::memory
