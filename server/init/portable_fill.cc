#include "server/init/portable_fill.h"

#include <ATen/ops/empty.h>
#include <dlfcn.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/init/fill.h"
#include "server/init/portable/portable.h"
#include "server/init/portable/portable_cuda.h"
#include "server/init/portable_request.h"
#include "server/init/schemes.h"

namespace materializer::init {
namespace {

[[noreturn]] void Fail(const absl::Status& status) {
  throw std::runtime_error(std::string(status.message()));
}

template <typename T>
T OrFail(absl::StatusOr<T> value) {
  if (!value.ok()) Fail(value.status());
  return *std::move(value);
}

bool NeedsFullTensor(const v1::InitScheme& scheme) {
  return scheme.has_eye() || scheme.has_dirac() || scheme.has_arange() ||
         scheme.has_rope_inv_freq();
}

// Waits for work queued on CUDA's legacy default stream.
void SynchronizeCuda() {
  using Synchronize = int (*)();
  static const Synchronize synchronize = [] {
    for (const char* name :
         {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (void* runtime = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) {
        return reinterpret_cast<Synchronize>(
            dlsym(runtime, "cudaDeviceSynchronize"));
      }
    }
    return static_cast<Synchronize>(nullptr);
  }();
  if (synchronize == nullptr || synchronize() != 0) {
    Fail(absl::InternalError("cudaDeviceSynchronize failed after a portable "
                             "fill"));
  }
}

}  // namespace

void FillPortableTensor(at::Tensor& view, const spec::TensorDesc& desc,
                        const v1::InitScheme& scheme, uint64_t seed,
                        int threads) {
  if (desc.numel == 0) return;
  if (!IsRandom(scheme)) {
    if (!desc.is_shard() || !NeedsFullTensor(scheme)) {
      Fill(view, scheme, std::nullopt);  // the value does not depend on where
      return;
    }
    // Computed for the full tensor, then sliced.
    at::Tensor full = at::empty(desc.full_shape(), view.options());
    Fill(full, scheme, std::nullopt);
    at::Tensor box = full;
    for (size_t d = 0; d < desc.shape.size(); ++d) {
      box = box.narrow(static_cast<int64_t>(d), desc.shard_offset[d],
                       desc.shape[d]);
    }
    view.copy_(box);
    return;
  }
  PortableTarget target;
  target.name = desc.name;
  target.dtype = desc.dtype;
  target.shape = desc.full_shape();
  if (desc.is_shard())
    target.box = portable::Box{desc.shard_offset, desc.shape};
  const portable::PortableRequest request =
      OrFail(PortableRequestFor(scheme, target, seed));
  if (view.is_cuda()) {
    absl::Status status =
        portable::FillPortableCuda(request, view.data_ptr(), nullptr);
    if (!status.ok()) Fail(status);
    SynchronizeCuda();
    return;
  }
  portable::FillOptions options;
  options.threads = threads;
  absl::Status status = portable::FillPortable(request, view.data_ptr(), options);
  if (!status.ok()) Fail(status);
}

}  // namespace materializer::init
