#include "server/delivery/xxh3_avx2.h"

#include <cstdlib>

// This file alone is compiled with -mavx2 (BUILD.bazel). xxhash.h, inlined
// here, then uses its AVX2 loops; every symbol stays in this translation
// unit (XXH_INLINE_ALL), apart from the functions below.
#if defined(__AVX2__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>
#endif

namespace materializer::delivery::xxh3_avx2 {

#if defined(__AVX2__)

namespace {
XXH3_state_t* State(void* state) { return static_cast<XXH3_state_t*>(state); }
}  // namespace

bool compiled() { return true; }

void* NewState() {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) std::abort();  // out of memory for 600 bytes
  XXH3_128bits_reset(state);
  return state;
}

void Free(void* state) { XXH3_freeState(State(state)); }

void Update(void* state, const void* data, size_t length) {
  XXH3_128bits_update(State(state), data, length);
}

void Digest(const void* state, uint64_t* high, uint64_t* low) {
  const XXH128_hash_t hash =
      XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state));
  *high = hash.high64;
  *low = hash.low64;
}

void HashBytes(const void* data, size_t length, uint64_t* high, uint64_t* low) {
  const XXH128_hash_t hash = XXH3_128bits(data, length);
  *high = hash.high64;
  *low = hash.low64;
}

#else  // not built for AVX2: digest.cc never calls these.

bool compiled() { return false; }
void* NewState() { std::abort(); }
void Free(void*) { std::abort(); }
void Update(void*, const void*, size_t) { std::abort(); }
void Digest(const void*, uint64_t*, uint64_t*) { std::abort(); }
void HashBytes(const void*, size_t, uint64_t*, uint64_t*) { std::abort(); }

#endif

}  // namespace materializer::delivery::xxh3_avx2
