#include "server/init/portable_fill.h"

#include <ATen/ops/empty.h>

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

}  // namespace

void FillPortableStep(at::Tensor& view, const spec::TensorDesc& desc,
                      const v1::InitScheme& scheme,
                      const std::optional<portable::Box>& region, uint32_t step,
                      uint64_t seed, int threads) {
  const portable::Box full = portable::FullBox(desc.full_shape());
  const portable::Box& filled = region.has_value() ? *region : full;
  const portable::Box stored =
      desc.is_shard() ? portable::Box{desc.shard_offset, desc.shape} : full;
  // The elements of the step that this view holds, in the coordinates of
  // the full tensor, of the step's region, and of the view.
  const portable::Box both = portable::Intersect(filled, stored);
  if (portable::NumElements(both) == 0) return;
  const portable::Box in_region = portable::Relative(both, filled.offset);
  at::Tensor dst = view;
  for (size_t d = 0; d < both.offset.size(); ++d) {
    dst = dst.narrow(static_cast<int64_t>(d), both.offset[d] - stored.offset[d],
                     both.length[d]);
  }
  const bool whole_region = in_region.length == filled.length;

  if (!IsRandom(scheme)) {
    if (whole_region) {
      Fill(dst, scheme, std::nullopt);  // the region as a tensor of its own
    } else {
      FillBox(dst, scheme, filled.length, in_region);
    }
    return;
  }
  PortableTarget target;
  target.name = desc.name;
  target.dtype = desc.dtype;
  target.shape = filled.length;
  if (!whole_region) target.box = in_region;
  target.stream = step;
  const portable::PortableRequest request =
      OrFail(PortableRequestFor(scheme, target, seed));
  // The kernels write the box dense: straight into the view where that is
  // the view's layout, else into scratch memory that is then copied.
  at::Tensor out =
      dst.is_contiguous() ? dst : at::empty(dst.sizes(), dst.options());
  if (out.is_cuda()) {
    // On the tensor's own device, whatever device this worker has current.
    absl::Status status = portable::FillPortableCudaOn(
        request, static_cast<int>(out.get_device()), out.data_ptr());
    if (!status.ok()) Fail(status);
  } else {
    portable::FillOptions options;
    options.threads = threads;
    absl::Status status =
        portable::FillPortable(request, out.data_ptr(), options);
    if (!status.ok()) Fail(status);
  }
  if (!out.is_same(dst)) dst.copy_(out);
}

}  // namespace materializer::init
