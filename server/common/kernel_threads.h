#ifndef MATERIALIZER_SERVER_COMMON_KERNEL_THREADS_H_
#define MATERIALIZER_SERVER_COMMON_KERNEL_THREADS_H_

// Server threads that already split work among themselves (the init
// threads, the checkpoint readers) call LibTorch kernels one per thread; a
// kernel that opened an OpenMP team of its own inside each would
// oversubscribe the machine (threads x cores). OpenMP's thread count is a
// per-thread setting, so each such thread sets its own to 1; MKL (LAPACK's
// QR for orthogonal) gets the same through its thread-local setting, which
// also makes its results reproducible: MKL's QR differs in the last bits
// between thread counts. LibTorch loads both runtimes; they are looked up
// rather than linked, and a LibTorch without them needs nothing.

#include <dlfcn.h>

namespace materializer {

inline void UseOneKernelThreadHere() {
  using SetNumThreads = int (*)(int);
  static const auto set_omp_threads = reinterpret_cast<void (*)(int)>(
      dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  // mkl_set_num_threads_local is a macro for this C entry point; the
  // lower-case symbol is the Fortran one (it takes an int*).
  static const auto set_mkl_threads = reinterpret_cast<SetNumThreads>(
      dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  if (set_omp_threads != nullptr) set_omp_threads(1);
  if (set_mkl_threads != nullptr) set_mkl_threads(1);
}

}  // namespace materializer

#endif  // MATERIALIZER_SERVER_COMMON_KERNEL_THREADS_H_
