#include "server/init/portable/portable_cuda.h"

#include "absl/strings/str_cat.h"
#include "server/init/portable/box.h"
#include "server/init/portable/cuda_launch.h"

namespace materializer::init::portable {
namespace {

struct Prepared {
  KernelParams params;
  RunLayout layout;
  int64_t bytes = 0;
};

absl::StatusOr<Prepared> Prepare(const PortableRequest& request) {
  Prepared p;
  absl::StatusOr<KernelParams> params = MakeKernelParams(request);
  if (!params.ok()) return params.status();
  p.params = *params;
  const Box box =
      request.box.has_value() ? *request.box : FullBox(request.shape);
  absl::StatusOr<RunLayout> layout = MakeRunLayout(request.shape, box);
  if (!layout.ok()) return layout.status();
  p.layout = *layout;
  absl::StatusOr<int64_t> bytes = PortableOutputBytes(request);
  if (!bytes.ok()) return bytes.status();
  p.bytes = *bytes;
  return p;
}

absl::Status ToStatus(const internal::CudaResult& result, const char* what) {
  if (result.code == 0) return absl::OkStatus();
  if (result.code == -1) return absl::UnavailableError(result.message);
  return absl::InternalError(absl::StrCat(what, ": ", result.message));
}

}  // namespace

bool PortableCudaBuilt() { return internal::CudaKernelsBuilt(); }

absl::StatusOr<int> PortableCudaDeviceCount() {
  int count = 0;
  const internal::CudaResult result = internal::CudaDeviceCount(&count);
  if (result.code != 0) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: ", result.message));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device");
  return count;
}

absl::Status FillPortableCuda(const PortableRequest& request, void* device_out,
                              CUstream_st* stream) {
  absl::StatusOr<Prepared> p = Prepare(request);
  if (!p.ok()) return p.status();
  return ToStatus(
      internal::LaunchPortableFill(p->params, p->layout, device_out, stream),
      "portable CUDA fill");
}

absl::Status FillPortableCudaOn(const PortableRequest& request, int device,
                                void* device_out) {
  absl::StatusOr<Prepared> p = Prepare(request);
  if (!p.ok()) return p.status();
  return ToStatus(
      internal::FillOnDevice(p->params, p->layout, device, device_out),
      "portable CUDA fill");
}

absl::Status FillPortableCudaToHost(const PortableRequest& request,
                                    void* host_out, int device) {
  absl::StatusOr<Prepared> p = Prepare(request);
  if (!p.ok()) return p.status();
  return ToStatus(
      internal::FillViaDevice(p->params, p->layout, device, host_out,
                              static_cast<size_t>(p->bytes)),
      "portable CUDA fill");
}

}  // namespace materializer::init::portable
