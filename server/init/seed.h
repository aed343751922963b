#ifndef MATERIALIZER_SERVER_INIT_SEED_H_
#define MATERIALIZER_SERVER_INIT_SEED_H_

// Per-tensor seeds. A tensor's random stream depends only on the request
// seed and its own name, so its values do not change with tensor order or
// with what else is in the request. docs/init.md gives the same function in
// Python.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace materializer::init {

// 64-bit FNV-1a over the bytes of `text`.
uint64_t Fnv1a64(absl::string_view text);

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective mixer.
uint64_t SplitMix64(uint64_t x);

// SplitMix64(seed ^ SplitMix64(Fnv1a64(name))).
uint64_t DeriveSeed(uint64_t seed, absl::string_view name);

}  // namespace materializer::init

#endif  // MATERIALIZER_SERVER_INIT_SEED_H_
