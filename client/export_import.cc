#include "client/export_import.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace materializer::client {
namespace {

// The CUDA runtime, looked up rather than linked so the client runs where
// there is no CUDA.
struct IpcHandle {
  char reserved[64];
};
using IpcOpen = int (*)(void**, IpcHandle, unsigned);
using IpcClose = int (*)(void*);
using SetDevice = int (*)(int);
using GetDevice = int (*)(int*);
constexpr unsigned kLazyEnablePeerAccess = 1;

struct CudaRuntime {
  IpcOpen open = nullptr;
  IpcClose close = nullptr;
  SetDevice set_device = nullptr;
  GetDevice get_device = nullptr;
};

const CudaRuntime* Runtime() {
  static const CudaRuntime* runtime = []() -> const CudaRuntime* {
    void* lib = nullptr;
    for (const char* name :
         {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) return nullptr;
    auto* out = new CudaRuntime;
    out->open = reinterpret_cast<IpcOpen>(dlsym(lib, "cudaIpcOpenMemHandle"));
    out->close =
        reinterpret_cast<IpcClose>(dlsym(lib, "cudaIpcCloseMemHandle"));
    out->set_device = reinterpret_cast<SetDevice>(dlsym(lib, "cudaSetDevice"));
    out->get_device = reinterpret_cast<GetDevice>(dlsym(lib, "cudaGetDevice"));
    if (!out->open || !out->close || !out->set_device || !out->get_device) {
      delete out;
      return nullptr;
    }
    return out;
  }();
  return runtime;
}

// Reserves `bytes` of address space (PROT_NONE), starting on a 2 MiB
// boundary when it is that large: the server's segments start at multiples
// of 2 MiB, and a file in a huge-page tmpfs (the server's --shm_dir) is
// mapped with 2 MiB pages only at an address aligned as its offset is.
// Null on failure (errno set).
void* ReserveOnHugePageBoundary(uint64_t bytes) {
  constexpr uint64_t kHugePage = uint64_t{2} << 20;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  const uint64_t padded = bytes >= kHugePage ? bytes + kHugePage : bytes;
  void* range = ::mmap(nullptr, padded, PROT_NONE, flags, -1, 0);
  if (range == MAP_FAILED) return nullptr;
  if (padded == bytes) return range;
  const auto start = reinterpret_cast<uintptr_t>(range);
  const uintptr_t base = (start + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
  if (base > start) ::munmap(range, base - start);
  if (start + padded > base + bytes) {
    ::munmap(reinterpret_cast<void*>(base + bytes),
             start + padded - (base + bytes));
  }
  return reinterpret_cast<void*>(base);
}

}  // namespace

absl::StatusOr<std::shared_ptr<const ExportImport>> ExportImport::Open(
    const v1::ExportResponse& response, bool writable) {
  std::shared_ptr<ExportImport> import(new ExportImport);
  import->size_ = response.arena_bytes();
  if (response.has_shared_memory()) {
    // The files the arena is made of, mapped back to back into one range
    // (one file unless the server built the arena from its pool).
    struct Segment {
      std::string path;
      uint64_t offset;
      uint64_t bytes;
    };
    std::vector<Segment> segments;
    for (const v1::SharedMemorySegment& s : response.shared_memory().segments()) {
      segments.push_back({s.path(), s.offset(), s.bytes()});
    }
    if (segments.empty()) {  // a server from before segments
      segments.push_back({response.shared_memory().path(), 0, import->size_});
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t covered = 0;
    for (const Segment& s : segments) {
      if (s.offset != covered || (segments.size() > 1 && s.offset % page != 0)) {
        return absl::DataLossError(absl::StrCat(
            "segment ", s.path, " starts at ", s.offset, ", expected ",
            covered, " (page-aligned)"));
      }
      covered += s.bytes;
    }
    if (covered != import->size_) {
      return absl::DataLossError(absl::StrCat(
          "the export's segments cover ", covered, " bytes, not its ",
          import->size_));
    }
    const uint64_t mapped = (import->size_ + page - 1) / page * page;
    std::byte* base = nullptr;
    if (mapped > 0) {
      void* region = ReserveOnHugePageBoundary(mapped);
      if (region == nullptr) {
        return absl::ErrnoToStatus(errno, "reserving the export's range");
      }
      base = static_cast<std::byte*>(region);
      // Owned by the import from here: its destructor unmaps the range.
      import->mapping_ = region;
      import->mapping_bytes_ = mapped;
      import->base_ = region;
    }
    for (const Segment& s : segments) {
      const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("opening the export ", s.path,
                                " (was its handle released?)"));
      }
      struct stat st;
      if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < s.bytes) {
        ::close(fd);
        return absl::DataLossError(absl::StrCat(
            s.path, " is smaller than the export's ", s.bytes, " bytes there"));
      }
      // The file stays open, with a shared flock, as long as the mapping:
      // the server counts a released handle's pages as handed over (still
      // its memory) until no importer holds a lock on them.
      import->fds_.push_back(fd);
      ::flock(fd, LOCK_SH);
      if (s.bytes > 0) {
        void* pages = ::mmap(base + s.offset, s.bytes,
                             writable ? PROT_READ | PROT_WRITE : PROT_READ,
                             (writable ? MAP_PRIVATE : MAP_SHARED) | MAP_FIXED,
                             fd, 0);
        if (pages == MAP_FAILED) {
          return absl::ErrnoToStatus(errno, absl::StrCat("mapping ", s.path));
        }
      }
    }
  } else if (response.has_cuda()) {
    const CudaRuntime* cuda = Runtime();
    if (cuda == nullptr) {
      return absl::FailedPreconditionError(
          "this export is CUDA memory, and this process has no CUDA runtime "
          "(libcudart) to open it");
    }
    const v1::CudaIpcExport& ipc = response.cuda();
    if (ipc.ipc_handle().size() != sizeof(IpcHandle)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda.ipc_handle has ", ipc.ipc_handle().size(), " bytes, not ",
          sizeof(IpcHandle)));
    }
    IpcHandle handle;
    std::memcpy(handle.reserved, ipc.ipc_handle().data(), sizeof(handle));
    int previous = 0;
    cuda->get_device(&previous);
    void* pointer = nullptr;
    int error = cuda->set_device(ipc.device_ordinal());
    if (error == 0) error = cuda->open(&pointer, handle, kLazyEnablePeerAccess);
    cuda->set_device(previous);
    if (error != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cudaIpcOpenMemHandle on cuda:", ipc.device_ordinal(), " (",
          ipc.device_uuid(), ") failed with CUDA error ", error,
          ": the importer must run on the same machine and see that device"));
    }
    import->mapping_ = pointer;
    import->cuda_device_ = ipc.device_ordinal();
    import->base_ = static_cast<char*>(pointer) + ipc.base_offset();
  } else {
    return absl::InvalidArgumentError("the export names no memory");
  }
  for (const v1::ExportedTensor& t : response.tensors()) {
    if (t.offset() > import->size_ || t.nbytes() > import->size_ - t.offset()) {
      return absl::DataLossError(absl::StrCat(
          "tensor ", t.name(), " [", t.offset(), ", +", t.nbytes(),
          ") lies outside the ", import->size_, "-byte export"));
    }
    TensorView view;
    view.name = t.name();
    view.dtype = t.dtype();
    view.shape.assign(t.shape().begin(), t.shape().end());
    view.data = static_cast<char*>(import->base_) + t.offset();
    view.nbytes = t.nbytes();
    import->tensors_.push_back(std::move(view));
  }
  return std::shared_ptr<const ExportImport>(std::move(import));
}

ExportImport::~ExportImport() {
  if (mapping_ != nullptr) {
    if (cuda_device_ >= 0) {
      if (const CudaRuntime* cuda = Runtime()) cuda->close(mapping_);
    } else {
      ::munmap(mapping_, mapping_bytes_);
    }
  }
  // After the unmap: closing drops the locks, and with them the server's
  // count of these pages once the handle is released.
  for (int fd : fds_) ::close(fd);
}

}  // namespace materializer::client
