#ifndef MATERIALIZER_CLIENT_EXPORT_IMPORT_H_
#define MATERIALIZER_CLIENT_EXPORT_IMPORT_H_

// The importer's side of ExportHandle: map an export into this process and
// view its tensors without copying a byte. No LibTorch here; export_torch.h
// turns the views into at::Tensors.
//
//   ASSIGN_OR_RETURN(v1::ExportResponse exported,
//                    client->ExportHandle(handle));
//   ASSIGN_OR_RETURN(std::shared_ptr<const ExportImport> import,
//                    ExportImport::Open(exported));
//   for (const ExportImport::TensorView& t : import->tensors()) ...
//   import.reset();                                  // unmaps
//   RETURN_IF_ERROR(client->CloseExport(exported.export_id()).status());
//
// Lifetimes (docs/delivery.md): a CPU mapping stays valid until it is
// unmapped, even after the server releases the handle (the pages go when
// the last mapping goes; until then the server counts them as handed over,
// which the import's shared flock on each file tells it). A CUDA mapping is valid while the export is open:
// close the import before CloseExport.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "materializer/v1/materializer.pb.h"

namespace materializer::client {

// One mapped export. Thread-safe to read; not copyable.
class ExportImport {
 public:
  struct TensorView {
    std::string name;
    std::string dtype;  // torch name, e.g. "bfloat16"
    std::vector<int64_t> shape;
    // Host memory (shared memory) or device memory (CUDA IPC).
    void* data = nullptr;
    uint64_t nbytes = 0;
  };

  // Maps a SharedMemoryExport read-only (or, with `writable`, copy-on-write
  // private: writes stay in this process and copy only the pages written),
  // or opens a CudaIpcExport on its device. FAILED_PRECONDITION for a CUDA
  // export where this process has no CUDA runtime; NOT_FOUND if the shared
  // memory file is gone (the handle was released).
  static absl::StatusOr<std::shared_ptr<const ExportImport>> Open(
      const v1::ExportResponse& response, bool writable = false);

  ~ExportImport();
  ExportImport(const ExportImport&) = delete;
  ExportImport& operator=(const ExportImport&) = delete;

  bool on_cuda() const { return cuda_device_ >= 0; }
  // The CUDA ordinal of a CUDA import, else -1.
  int cuda_device() const { return cuda_device_; }
  // Start and size of the mapped arena.
  void* data() const { return base_; }
  uint64_t size() const { return size_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }

 private:
  ExportImport() = default;

  void* mapping_ = nullptr;  // what to munmap / cudaIpcCloseMemHandle
  uint64_t mapping_bytes_ = 0;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  int cuda_device_ = -1;
  // The shared-memory files, held open with a shared flock while mapped.
  std::vector<int> fds_;
  std::vector<TensorView> tensors_;
};

}  // namespace materializer::client

#endif  // MATERIALIZER_CLIENT_EXPORT_IMPORT_H_
