#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_TABLE_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_TABLE_H_

// Maps (dist, format) to a FillRunFn instantiation of a kernel template;
// shared by the per-ISA translation units.

#include "server/init/portable/cpu_kernels.h"
#include "server/init/portable/hd.h"
#include "server/init/portable/kernel_params.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// Kernel<kDist, kFormat>::Run must be a FillRunFn.
template <template <Dist, Format> class Kernel, Dist kDist>
internal::FillRunFn PickFormat(Format format) {
  switch (format) {
    case Format::kFloat32:
      return &Kernel<kDist, Format::kFloat32>::Run;
    case Format::kFloat64:
      return &Kernel<kDist, Format::kFloat64>::Run;
    case Format::kBFloat16:
      return &Kernel<kDist, Format::kBFloat16>::Run;
    case Format::kFloat16:
      return &Kernel<kDist, Format::kFloat16>::Run;
    case Format::kFloat8E4M3FN:
      return &Kernel<kDist, Format::kFloat8E4M3FN>::Run;
    case Format::kFloat8E5M2:
      return &Kernel<kDist, Format::kFloat8E5M2>::Run;
  }
  return nullptr;
}

template <template <Dist, Format> class Kernel>
internal::FillRunFn PickKernel(Dist dist, Format format) {
  switch (dist) {
    case Dist::kConstant:
      return PickFormat<Kernel, Dist::kConstant>(format);
    case Dist::kUniform:
      return PickFormat<Kernel, Dist::kUniform>(format);
    case Dist::kNormal:
      return PickFormat<Kernel, Dist::kNormal>(format);
    case Dist::kTruncNormal:
      return PickFormat<Kernel, Dist::kTruncNormal>(format);
  }
  return nullptr;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_KERNEL_TABLE_H_
