#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_SIMD_RUN_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_SIMD_RUN_H_

// The SIMD fill loop, generic over a backend B that supplies the vector
// types and their operations (kernel_avx2.cc, kernel_avx512.cc):
//   B::kWidth           lanes per vector (8 or 16; divides 16)
//   B::F, B::U          float / uint32 vectors with the exact_math.h ops
//   B::Iota()           U with lanes 0, 1, ..., kWidth - 1
//   B::Put<kFormat>(T*, F)  store a vector of compute values into format T's
//                       storage (float32, or narrow bits packed to 16/8 bits)
// Elements of whole 64-element groups are computed kWidth blocks at a time:
// the lanes are consecutive blocks, and word j of each lands on consecutive
// elements (generate.h), so there is no transposition. The head and tail
// of a run that are not whole groups go through FillRunScalar, which is
// the same arithmetic one block at a time. float64 runs are scalar.

#include <cstdint>

#include "server/init/portable/generate.h"
#include "server/init/portable/hd.h"
#include "server/init/portable/kernel_params.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

template <class B, Dist kDist, Format kFormat>
void FillRunSimd(const KernelParams& k, int64_t i0, int64_t n,
                 typename Store<kFormat>::T* out) {
  if constexpr (kFormat == Format::kFloat64) {
    FillRunScalar<kDist, kFormat>(k, i0, n, out);
  } else {
    using F = typename B::F;
    using U = typename B::U;
    const int64_t end = i0 + n;
    // No std:: helpers here: an inline library function instantiated in
    // this (AVX-compiled) unit could be picked by the linker for others.
    const int64_t aligned = (i0 + 63) & ~int64_t{63};
    const int64_t head_end = aligned < end ? aligned : end;
    FillRunScalar<kDist, kFormat>(k, i0, head_end - i0, out);
    int64_t i = head_end;
    // Round keys broadcast once per run.
    const PhiloxRoundKeys<10> keys = MakeRoundKeys<10>(k.key0, k.key1);
    U key0[10], key1[10];
    for (int r = 0; r < 10; ++r) {
      key0[r] = U(keys.key0[r]);
      key1[r] = U(keys.key1[r]);
    }
    for (; i + 64 <= end; i += 64) {
      const uint64_t group = uint64_t(i) >> 6;
      for (int half = 0; half < kBlocksPerGroup; half += B::kWidth) {
        const uint64_t block0 = group * kBlocksPerGroup + half;
        // block0 is a multiple of kWidth, so the low word never carries.
        U x0 = U(uint32_t(block0)) + B::Iota();
        U x1 = U(uint32_t(block0 >> 32));
        U x2 = U(k.stream);
        U x3 = U(0u);
        if constexpr (kDist != Dist::kConstant) {
          Philox4x32Rounds<10>(x0, x1, x2, x3, key0, key1);
        }
        F e0, e1, e2, e3;
        GenerateF32<kDist, F, U>(k.f, x0, x1, x2, x3, &e0, &e1, &e2, &e3);
        typename Store<kFormat>::T* dst = out + (i - i0) + half;
        B::template Put<kFormat>(dst, e0);
        B::template Put<kFormat>(dst + 16, e1);
        B::template Put<kFormat>(dst + 32, e2);
        B::template Put<kFormat>(dst + 48, e3);
      }
    }
    FillRunScalar<kDist, kFormat>(k, i, end - i, out + (i - i0));
  }
}

// Type-erased entry point: fills elements [i0, i0 + n) of the full tensor
// into out, typed by k.format.
template <class B, Dist kDist, Format kFormat>
void FillRunSimdErased(const KernelParams& k, int64_t i0, int64_t n,
                       void* out) {
  FillRunSimd<B, kDist, kFormat>(k, i0, n,
                                 static_cast<typename Store<kFormat>::T*>(out));
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_SIMD_RUN_H_
