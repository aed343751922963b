#include "server/memory/arena.h"

#include <sys/mman.h>

#include <cstring>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/strides.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"
#include "server/common/torch_guard.h"
#include "server/common/units.h"
#include "server/memory/arena_views.h"
#include "server/spec/torch_dtype.h"

namespace materializer::memory {
namespace {

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
  // Large arenas are written linearly by init; huge pages cut TLB misses.
  // Advisory: ignored where transparent huge pages are off.
  if (bytes >= (uint64_t{32} << 20)) madvise(pages, bytes, MADV_HUGEPAGE);
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

Arena::~Arena() = default;

size_t Arena::num_tensors() const { return tensors_->views.size(); }

absl::StatusOr<std::unique_ptr<Arena>> Arena::Allocate(
    Reservation reservation, const std::vector<spec::TensorDesc>& tensors,
    const spec::Layout& layout) {
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
  if (device.kind == DeviceKind::kCpu) {
    ASSIGN_OR_RETURN(storage,
                     AllocateHostStorage(layout.arena_bytes, &arena->host_data_));
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

absl::Status Arena::CopyToHost(uint64_t offset, uint64_t length,
                               void* dst) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "arena range [", offset, ", ", offset + length, ") is outside its ",
        bytes_, " bytes"));
  }
  if (length == 0) return absl::OkStatus();
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

}  // namespace materializer::memory
