#ifndef MATERIALIZER_SERVER_DELIVERY_XXH3_BUILDS_H_
#define MATERIALIZER_SERVER_DELIVERY_XXH3_BUILDS_H_

// XXH3-128 built for wider vector units than the system libxxhash (built
// for SSE2, the x86-64 baseline): xxhash.h's own code compiled once for
// AVX2 and once for AVX-512 (xxh3_build.inc, included by xxh3_avx2.cc and
// xxh3_avx512.cc, each compiled with its -m flag). Same digests, faster:
// on data in cache 23.5 and 32.4 GB/s against 10.1 on a 2-core Xeon, 17.3
// and 44.4 GB/s (AVX2, AVX-512) on a 2-core AMD EPYC (docs/delivery.md,
// "Digests"). digest.cc picks the widest one the CPU runs, once per
// process; nothing else calls these.

#include <cstddef>
#include <cstdint>

namespace materializer::delivery {

// One build's functions. States are XXH3_state_t of that build, to be
// passed only to the same build's functions.
struct Xxh3Build {
  void* (*new_state)();  // a fresh state; free releases it
  void (*free)(void* state);
  void (*update)(void* state, const void* data, size_t length);
  // The digest so far, high 64 bits first.
  void (*digest)(const void* state, uint64_t* high, uint64_t* low);
  void (*hash)(const void* data, size_t length, uint64_t* high, uint64_t* low);
};

// The build, or nullptr where this binary lacks it (not x86-64, or a
// compiler without the flag). The CPU may still lack the instructions:
// the caller checks.
const Xxh3Build* Xxh3Avx2();
const Xxh3Build* Xxh3Avx512();

}  // namespace materializer::delivery

#endif  // MATERIALIZER_SERVER_DELIVERY_XXH3_BUILDS_H_
