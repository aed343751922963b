#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_HD_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_HD_H_

// Macros shared by the header-only core of the portable RNG (philox.h,
// exact_math.h, narrow.h, generate.h), which nvcc and the host compiler
// both compile.
//
// MAT_HD marks a function callable from host and device code: empty for the
// host compiler, `__host__ __device__` under nvcc.
//
// MAT_PORTABLE_ISA names an inline namespace around every function of the
// core. The CPU kernels are compiled once per instruction set (scalar,
// AVX2, AVX-512), each translation unit with its own -m flags and its own
// -DMAT_PORTABLE_ISA=..., so the inline functions each one instantiates
// are distinct symbols: the linker can never hand the baseline code an
// AVX-512 copy of a shared inline function (an ODR trap that would crash on
// older CPUs). Plain data types shared across those units live outside it
// (kernel_params.h).

#if defined(__CUDACC__)
#define MAT_HD __host__ __device__
#else
#define MAT_HD
#endif

#ifndef MAT_PORTABLE_ISA
#define MAT_PORTABLE_ISA isa_generic
#endif

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_HD_H_
