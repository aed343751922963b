// XXH3 built for AVX-512: this file alone is compiled with -mavx512f
// (BUILD.bazel).
#if defined(__AVX512F__)
#define XXH_VECTOR XXH_AVX512
#endif
#define XXH3_BUILD_ACCESSOR Xxh3Avx512
#include "server/delivery/xxh3_build.inc"
