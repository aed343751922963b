#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_CPU_KERNELS_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_CPU_KERNELS_H_

// The CPU kernels, one translation unit per instruction set, each compiled
// with its own -m flags (see BUILD.bazel) and selected at run time by
// portable.cc. Internal to the portable library.

#include <cstdint>

#include "server/init/portable/kernel_params.h"

namespace materializer::init::portable::internal {

// Fills elements [i0, i0 + n) of the full tensor into out[0, n) (element
// type per k.format). Thread-safe: a pure function of its arguments.
using FillRunFn = void (*)(const KernelParams& k, int64_t i0, int64_t n,
                           void* out);

// The kernel for (dist, format) on each path; nullptr where the path was
// not compiled in (a non-x86 build). Callers check the CPU first.
FillRunFn ScalarFillRun(Dist dist, Format format);
FillRunFn Avx2FillRun(Dist dist, Format format);
FillRunFn Avx512FillRun(Dist dist, Format format);

}  // namespace materializer::init::portable::internal

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_CPU_KERNELS_H_
