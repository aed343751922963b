#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_GENERATE_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_GENERATE_H_

// From Philox words to element values: the word -> float constructions,
// Box-Muller, the inverse-CDF truncated normal, and the mapping of elements
// to (block, word). Everything here is a pure function of (params, full
// linear index), which is what makes a box's bytes equal the same slice of
// the full tensor, on any path and any device. docs/portable-rng.md states
// the same algorithm in prose; tests/python/portable_ref.py in NumPy.
//
// GenerateF32 is generic over the float type (scalar or SIMD); the float64
// code is scalar.

#include <cstdint>

#include "server/init/portable/exact_math.h"
#include "server/init/portable/hd.h"
#include "server/init/portable/kernel_params.h"
#include "server/init/portable/narrow.h"
#include "server/init/portable/philox.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// ---- Element <-> (block, word) ---------------------------------------------

// float32 compute: element i is word (i >> 4) & 3 of block
// ((i >> 6) << 4) | (i & 15).
MAT_HD inline uint64_t BlockOfF32(uint64_t i) {
  return ((i >> 6) << 4) | (i & 15);
}
MAT_HD inline uint64_t ElementOfF32(uint64_t block, int word) {
  return ((block >> 4) << 6) | (uint64_t(word) << 4) | (block & 15);
}
// float64 compute: element i is word pair (i >> 4) & 1 of block
// ((i >> 5) << 4) | (i & 15).
MAT_HD inline uint64_t BlockOfF64(uint64_t i) {
  return ((i >> 5) << 4) | (i & 15);
}
MAT_HD inline uint64_t ElementOfF64(uint64_t block, int pair) {
  return ((block >> 4) << 5) | (uint64_t(pair) << 4) | (block & 15);
}

// ---- float32 compute, generic over the float type F ------------------------

// [0, 1): the top 24 bits of w, times 2^-24 (exact).
template <class F, class U>
MAT_HD inline F UnitF32(U w) {
  return ToFloat(w >> 8) * F(0x1p-24f);
}

// Box-Muller on the words (wa, wb): r = sqrt(-2 ln u1) with u1 in (0, 1]
// from wa; the angle 2 pi t with t the top 24 bits of wb as a fraction,
// reduced exactly in integers to a quadrant k and x in [-1/4, 1/4).
template <class F, class U>
MAT_HD inline void BoxMullerF32(U wa, U wb, F* z0, F* z1) {
  const F u1 = ToFloat((wa >> 8) + U(1u)) * F(0x1p-24f);
  const F r = Sqrt(LogF32(u1) * F(-2.0f));
  const U m = wb >> 8;                   // angle = 2 pi m / 2^24
  const U q = (m + U(0x200000u)) >> 22;  // nearest quarter turn, 0..4
  const F x = ToFloat(m - (q << 22)) * F(0x1p-23f);  // angle = pi (q/2 + x)
  F s, c;
  SinCosPiF32(x, &s, &c);
  const auto odd = Eq(q & U(1u), U(1u));
  const F cos_abs = Select(odd, s, c);
  const F sin_abs = Select(odd, c, s);
  const U cos_sign = ((q + U(1u)) & U(2u)) << 30;  // quadrants 1, 2
  const U sin_sign = (q & U(2u)) << 30;            // quadrants 2, 3
  *z0 = r * AsF(AsU(cos_abs) ^ cos_sign);
  *z1 = r * AsF(AsU(sin_abs) ^ sin_sign);
}

// Truncated normal by inverse CDF: u in (0, 1) from the top 23 bits of w
// plus half a step; y = lo + u * width covers [erf(alpha/sqrt2),
// erf(beta/sqrt2)]; x = scale * erfinv(y) + shift, clamped to the bounds.
template <class F, class U>
MAT_HD inline F TruncNormalF32(const DistParams<float>& p, U w) {
  const F u = ToFloat(((w >> 9) << 1) | U(1u)) * F(0x1p-24f);
  const F y = Fma(u, F(p.width), F(p.lo));
  const F x = Fma(ErfInvF32(y), F(p.scale), F(p.shift));
  return Min(Max(x, F(p.clamp_lo)), F(p.clamp_hi));
}

// The four values of one block (float32 compute) from its words.
template <Dist kDist, class F, class U>
MAT_HD inline void GenerateF32(const DistParams<float>& p, U w0, U w1, U w2,
                               U w3, F* e0, F* e1, F* e2, F* e3) {
  if constexpr (kDist == Dist::kConstant) {
    *e0 = *e1 = *e2 = *e3 = F(p.shift);
  } else if constexpr (kDist == Dist::kUniform) {
    *e0 = Fma(UnitF32<F>(w0), F(p.scale), F(p.shift));
    *e1 = Fma(UnitF32<F>(w1), F(p.scale), F(p.shift));
    *e2 = Fma(UnitF32<F>(w2), F(p.scale), F(p.shift));
    *e3 = Fma(UnitF32<F>(w3), F(p.scale), F(p.shift));
  } else if constexpr (kDist == Dist::kNormal) {
    F z0, z1, z2, z3;
    BoxMullerF32(w0, w1, &z0, &z1);
    BoxMullerF32(w2, w3, &z2, &z3);
    *e0 = Fma(z0, F(p.scale), F(p.shift));
    *e1 = Fma(z1, F(p.scale), F(p.shift));
    *e2 = Fma(z2, F(p.scale), F(p.shift));
    *e3 = Fma(z3, F(p.scale), F(p.shift));
  } else {
    *e0 = TruncNormalF32<F>(p, w0);
    *e1 = TruncNormalF32<F>(p, w1);
    *e2 = TruncNormalF32<F>(p, w2);
    *e3 = TruncNormalF32<F>(p, w3);
  }
}

// The Philox words of block b: counter (b_lo, b_hi, stream, 0).
MAT_HD inline PhiloxWords BlockWords(const KernelParams& k, uint64_t block) {
  PhiloxWords w = {{uint32_t(block), uint32_t(block >> 32), k.stream, 0u}};
  return Philox4x32_10(w, k.key0, k.key1);
}

template <Dist kDist>
MAT_HD inline void BlockValuesF32(const KernelParams& k, uint64_t block,
                                  float e[4]) {
  PhiloxWords w = {{0u, 0u, 0u, 0u}};
  if constexpr (kDist != Dist::kConstant) w = BlockWords(k, block);
  GenerateF32<kDist, float, uint32_t>(k.f, w.v[0], w.v[1], w.v[2], w.v[3],
                                      &e[0], &e[1], &e[2], &e[3]);
}

// ---- float64 compute (scalar) ----------------------------------------------

// 53 bits from a word pair: hi's 32 bits above lo's top 21.
MAT_HD inline uint64_t Bits53(uint32_t hi, uint32_t lo) {
  return (uint64_t(hi) << 21) | (lo >> 11);
}

MAT_HD inline void BoxMullerF64(uint64_t ma, uint64_t mb, double* z0,
                                double* z1) {
  const double u1 = ToFloat(ma + 1u) * 0x1p-53;  // (0, 1]
  const double r = Sqrt(LogF64(u1) * -2.0);
  const uint64_t q = (mb + (uint64_t(1) << 50)) >> 51;
  const double x = ToFloat(mb - (q << 51)) * 0x1p-52;
  double s, c;
  SinCosPiF64(x, &s, &c);
  const bool odd = (q & 1u) != 0;
  const double cos_abs = odd ? s : c;
  const double sin_abs = odd ? c : s;
  *z0 = r * AsF(AsU(cos_abs) ^ (((q + 1u) & 2u) << 62));
  *z1 = r * AsF(AsU(sin_abs) ^ ((q & 2u) << 62));
}

MAT_HD inline double TruncNormalF64(const DistParams<double>& p, uint64_t m53) {
  const double u = ToFloat(((m53 >> 1) << 1) | 1u) * 0x1p-53;
  const double y = Fma(u, p.width, p.lo);
  const double x = Fma(ErfInvF64(y), p.scale, p.shift);
  return Min(Max(x, p.clamp_lo), p.clamp_hi);
}

template <Dist kDist>
MAT_HD inline void BlockValuesF64(const KernelParams& k, uint64_t block,
                                  double e[2]) {
  const DistParams<double>& p = k.d;
  if constexpr (kDist == Dist::kConstant) {
    e[0] = e[1] = p.shift;
    return;
  } else {
    const PhiloxWords w = BlockWords(k, block);
    const uint64_t m0 = Bits53(w.v[0], w.v[1]);
    const uint64_t m1 = Bits53(w.v[2], w.v[3]);
    if constexpr (kDist == Dist::kUniform) {
      e[0] = Fma(ToFloat(m0) * 0x1p-53, p.scale, p.shift);
      e[1] = Fma(ToFloat(m1) * 0x1p-53, p.scale, p.shift);
    } else if constexpr (kDist == Dist::kNormal) {
      double z0, z1;
      BoxMullerF64(m0, m1, &z0, &z1);
      e[0] = Fma(z0, p.scale, p.shift);
      e[1] = Fma(z1, p.scale, p.shift);
    } else {
      e[0] = TruncNormalF64(p, m0);
      e[1] = TruncNormalF64(p, m1);
    }
  }
}

// ---- Output formats
// ----------------------------------------------------------

template <Format kFormat>
struct Store;
template <>
struct Store<Format::kFloat32> {
  using T = float;
  MAT_HD static T From(float x) { return x; }
};
template <>
struct Store<Format::kFloat64> {
  using T = double;
  MAT_HD static T From(double x) { return x; }
};
template <>
struct Store<Format::kBFloat16> {
  using T = uint16_t;
  MAT_HD static T From(float x) { return T(RoundToNarrow<BFloat16Format>(x)); }
};
template <>
struct Store<Format::kFloat16> {
  using T = uint16_t;
  MAT_HD static T From(float x) { return T(RoundToNarrow<Float16Format>(x)); }
};
template <>
struct Store<Format::kFloat8E4M3FN> {
  using T = uint8_t;
  MAT_HD static T From(float x) {
    return T(RoundToNarrow<Float8E4M3FNFormat>(x));
  }
};
template <>
struct Store<Format::kFloat8E5M2> {
  using T = uint8_t;
  MAT_HD static T From(float x) {
    return T(RoundToNarrow<Float8E5M2Format>(x));
  }
};

// ---- Runs
// --------------------------------------------------------------------

// Full linear index of the first element of run r.
MAT_HD inline int64_t RunStart(const RunLayout& layout, int64_t run) {
  int64_t start = layout.base;
  for (int k = layout.outer_rank - 1; k >= 0; --k) {
    const int64_t len = layout.outer_len[k];
    start += (run % len) * layout.outer_stride[k];
    run /= len;
  }
  return start;
}

// Writes elements [i0, i0 + n) of the full tensor to out[0, n), one block
// at a time: the scalar path, and the head and tail of the SIMD paths.
template <Dist kDist, Format kFormat>
inline void FillRunScalar(const KernelParams& k, int64_t i0, int64_t n,
                          typename Store<kFormat>::T* out) {
  if (n <= 0) return;
  const int64_t end = i0 + n;
  if constexpr (kFormat == Format::kFloat64) {
    for (int64_t g = i0 >> 5; g <= (end - 1) >> 5; ++g) {
      for (int l = 0; l < kBlocksPerGroup; ++l) {
        const int64_t first = (g << 5) | l;
        if (first + 16 < i0 || first >= end) continue;
        double e[2];
        BlockValuesF64<kDist>(k, uint64_t(g) * kBlocksPerGroup + l, e);
        for (int j = 0; j < 2; ++j) {
          const int64_t i = first + 16 * j;
          if (i >= i0 && i < end) out[i - i0] = e[j];
        }
      }
    }
  } else {
    for (int64_t g = i0 >> 6; g <= (end - 1) >> 6; ++g) {
      for (int l = 0; l < kBlocksPerGroup; ++l) {
        const int64_t first = (g << 6) | l;
        if (first + 48 < i0 || first >= end) continue;
        float e[4];
        BlockValuesF32<kDist>(k, uint64_t(g) * kBlocksPerGroup + l, e);
        for (int j = 0; j < 4; ++j) {
          const int64_t i = first + 16 * j;
          if (i >= i0 && i < end) out[i - i0] = Store<kFormat>::From(e[j]);
        }
      }
    }
  }
}

// ---- One block of a box: the CUDA thread's work --------------------------

// Philox blocks a run can touch: it may start anywhere in its first group.
// Threads of the CUDA kernel are numbered run * BlocksPerRun + local block.
MAT_HD inline int64_t BlocksPerRun(const RunLayout& layout, bool f64) {
  const int64_t group = f64 ? 32 : 64;
  return ((layout.run_len + group - 2) / group + 1) * kBlocksPerGroup;
}

// Computes block `t` of the box (as numbered above) and stores the values
// of its elements that fall inside their run into `out` (the box, dense).
// Blocks of one group are consecutive t, and their values consecutive
// elements, so consecutive threads store to consecutive addresses.
template <Dist kDist, Format kFormat>
MAT_HD inline void FillBoxBlock(const KernelParams& k, const RunLayout& layout,
                                int64_t blocks_per_run, int64_t t,
                                typename Store<kFormat>::T* out) {
  constexpr bool kF64 = kFormat == Format::kFloat64;
  constexpr int kGroupShift = kF64 ? 5 : 6;
  constexpr int kLanes = kF64 ? 2 : 4;
  const int64_t run = layout.num_runs == 1 ? 0 : t / blocks_per_run;
  const int64_t local = t - run * blocks_per_run;
  const int64_t i0 = RunStart(layout, run);
  const int64_t end = i0 + layout.run_len;
  const int64_t group = (i0 >> kGroupShift) + local / kBlocksPerGroup;
  const int lane = static_cast<int>(local % kBlocksPerGroup);
  const int64_t first = (group << kGroupShift) | lane;
  if (first + 16 * (kLanes - 1) < i0 || first >= end) return;
  typename Store<kFormat>::T* run_out = out + run * layout.run_len;
  const uint64_t block = uint64_t(group) * kBlocksPerGroup + lane;
  if constexpr (kF64) {
    double e[2];
    BlockValuesF64<kDist>(k, block, e);
    for (int j = 0; j < 2; ++j) {
      const int64_t i = first + 16 * j;
      if (i >= i0 && i < end) run_out[i - i0] = e[j];
    }
  } else {
    float e[4];
    BlockValuesF32<kDist>(k, block, e);
    for (int j = 0; j < 4; ++j) {
      const int64_t i = first + 16 * j;
      if (i >= i0 && i < end) run_out[i - i0] = Store<kFormat>::From(e[j]);
    }
  }
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_GENERATE_H_
