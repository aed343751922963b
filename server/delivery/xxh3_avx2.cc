// XXH3 built for AVX2: this file alone is compiled with -mavx2 (BUILD.bazel).
#if defined(__AVX2__)
#define XXH_VECTOR XXH_AVX2
#endif
#define XXH3_BUILD_ACCESSOR Xxh3Avx2
#include "server/delivery/xxh3_build.inc"
