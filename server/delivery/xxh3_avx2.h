#ifndef MATERIALIZER_SERVER_DELIVERY_XXH3_AVX2_H_
#define MATERIALIZER_SERVER_DELIVERY_XXH3_AVX2_H_

// XXH3-128 built for AVX2, beside the system libxxhash (built for SSE2,
// the x86-64 baseline). Same digests, about twice the speed on data in
// cache: 19-24 GB/s against 10-11 on the 2-core Xeon this was measured on
// (docs/delivery.md, "Digests"). digest.cc picks it at run time when the
// CPU has AVX2; nothing else calls it.
//
// On other targets (or a compiler without -mavx2) compiled() is false and
// the functions below must not be called.

#include <cstddef>
#include <cstdint>

namespace materializer::delivery::xxh3_avx2 {

// Whether this build holds the AVX2 code (the CPU may still lack AVX2).
bool compiled();

// A fresh XXH3 state of this build; Free releases it.
void* NewState();
void Free(void* state);
void Update(void* state, const void* data, size_t length);
// The digest so far, high 64 bits first.
void Digest(const void* state, uint64_t* high, uint64_t* low);
void HashBytes(const void* data, size_t length, uint64_t* high, uint64_t* low);

}  // namespace materializer::delivery::xxh3_avx2

#endif  // MATERIALIZER_SERVER_DELIVERY_XXH3_AVX2_H_
