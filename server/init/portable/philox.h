#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_PHILOX_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_PHILOX_H_

// Philox4x32-R, the counter-based generator of Salmon, Moraes, Dror and
// Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11), exactly as
// Random123's philox4x32_R: R rounds of a Feistel-like network keyed by two
// 32-bit words, bumped by the Weyl constants before every round but the
// first. It is a pure function of (counter, key): no state, so any element
// of any tensor can be computed on its own, on any device, in any order.
//
// Generic over the word type U: uint32_t here (host and device), and SIMD
// vectors of 32-bit lanes in the CPU kernels, which supply their own
// MulHiLo overload. philox_test.cc checks Random123's known-answer vectors.

#include <cstdint>

#include "server/init/portable/hd.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

// The low 32 bits of a * m; the high 32 bits go to *hi.
MAT_HD inline uint32_t MulHiLo(uint32_t a, uint32_t m, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, m);
  return a * m;
#else
  const uint64_t product = static_cast<uint64_t>(a) * m;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
#endif
}

// The key of each round: (key0, key1) for the first, then bumped by the
// Weyl constants (W0, W1) before every other round.
template <int kRounds>
struct PhiloxRoundKeys {
  uint32_t key0[kRounds];
  uint32_t key1[kRounds];
};
template <int kRounds>
MAT_HD inline PhiloxRoundKeys<kRounds> MakeRoundKeys(uint32_t key0,
                                                     uint32_t key1) {
  PhiloxRoundKeys<kRounds> keys;
  for (int round = 0; round < kRounds; ++round) {
    keys.key0[round] = key0;
    keys.key1[round] = key1;
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  return keys;
}

// Applies kRounds rounds to the counter (x0, x1, x2, x3) in place, turning
// it into the four output words. key0[r], key1[r]: round r's key, as words
// (K = U) or scalars (K = uint32_t); SIMD callers pass keys broadcast once
// per run.
template <int kRounds, class U, class K>
MAT_HD inline void Philox4x32Rounds(U& x0, U& x1, U& x2, U& x3, const K* key0,
                                    const K* key1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC unroll 16
#endif
  for (int round = 0; round < kRounds; ++round) {
    U hi0, hi1;
    const U lo0 = MulHiLo(x0, kPhiloxM0, &hi0);
    const U lo1 = MulHiLo(x2, kPhiloxM1, &hi1);
    const U y0 = hi1 ^ x1 ^ U(key0[round]);
    const U y2 = hi0 ^ x3 ^ U(key1[round]);
    x0 = y0;
    x1 = lo1;
    x2 = y2;
    x3 = lo0;
  }
}

// As Random123's philox4x32_R(R, counter, key).
template <int kRounds, class U>
MAT_HD inline void Philox4x32(U& x0, U& x1, U& x2, U& x3, uint32_t key0,
                              uint32_t key1) {
  const PhiloxRoundKeys<kRounds> keys = MakeRoundKeys<kRounds>(key0, key1);
  Philox4x32Rounds<kRounds>(x0, x1, x2, x3, keys.key0, keys.key1);
}

// Philox4x32-10 on one counter, for callers that want plain arrays.
struct PhiloxWords {
  uint32_t v[4];
};
MAT_HD inline PhiloxWords Philox4x32_10(PhiloxWords counter, uint32_t key0,
                                        uint32_t key1) {
  Philox4x32<10>(counter.v[0], counter.v[1], counter.v[2], counter.v[3], key0,
                 key1);
  return counter;
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_PHILOX_H_
