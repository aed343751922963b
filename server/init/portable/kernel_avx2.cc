// The AVX2 + FMA kernel: 8 Philox blocks per vector. Compiled with
// -mavx2 -mfma (BUILD.bazel); portable.cc calls it only on CPUs that have
// both. The arithmetic is exact_math.h's, so its bits equal the scalar
// path's (portable_test checks every path this CPU has).

#include "server/init/portable/cpu_kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include "server/init/portable/generate.h"
#include "server/init/portable/kernel_table.h"
#include "server/init/portable/simd_run.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {
namespace {

struct VU8 {
  __m256i v;
  VU8() = default;
  VU8(uint32_t x) : v(_mm256_set1_epi32(static_cast<int>(x))) {}
  explicit VU8(__m256i x) : v(x) {}
};
struct VF8 {
  __m256 v;
  VF8() = default;
  VF8(float x) : v(_mm256_set1_ps(x)) {}
  explicit VF8(__m256 x) : v(x) {}
};
// All-ones lanes where true.
struct VM8 {
  __m256i v;
};

inline VF8 operator+(VF8 a, VF8 b) { return VF8(_mm256_add_ps(a.v, b.v)); }
inline VF8 operator-(VF8 a, VF8 b) { return VF8(_mm256_sub_ps(a.v, b.v)); }
inline VF8 operator*(VF8 a, VF8 b) { return VF8(_mm256_mul_ps(a.v, b.v)); }
inline VF8 Div(VF8 a, VF8 b) { return VF8(_mm256_div_ps(a.v, b.v)); }
inline VF8 Fma(VF8 a, VF8 b, VF8 c) {
  return VF8(_mm256_fmadd_ps(a.v, b.v, c.v));
}
inline VF8 Sqrt(VF8 a) { return VF8(_mm256_sqrt_ps(a.v)); }
inline VF8 Neg(VF8 a) { return VF8(_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))); }

inline VU8 operator+(VU8 a, VU8 b) { return VU8(_mm256_add_epi32(a.v, b.v)); }
inline VU8 operator-(VU8 a, VU8 b) { return VU8(_mm256_sub_epi32(a.v, b.v)); }
inline VU8 operator^(VU8 a, VU8 b) { return VU8(_mm256_xor_si256(a.v, b.v)); }
inline VU8 operator&(VU8 a, VU8 b) { return VU8(_mm256_and_si256(a.v, b.v)); }
inline VU8 operator|(VU8 a, VU8 b) { return VU8(_mm256_or_si256(a.v, b.v)); }
inline VU8 operator>>(VU8 a, int s) { return VU8(_mm256_srli_epi32(a.v, s)); }
inline VU8 operator<<(VU8 a, int s) { return VU8(_mm256_slli_epi32(a.v, s)); }

inline VU8 AsU(VF8 a) { return VU8(_mm256_castps_si256(a.v)); }
inline VF8 AsF(VU8 a) { return VF8(_mm256_castsi256_ps(a.v)); }
inline VF8 ToFloat(VU8 a) { return VF8(_mm256_cvtepi32_ps(a.v)); }

inline VM8 Lt(VF8 a, VF8 b) {
  return VM8{_mm256_castps_si256(_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))};
}
inline VM8 Gt(VF8 a, VF8 b) {
  return VM8{_mm256_castps_si256(_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ))};
}
// Signed 32-bit comparisons (callers compare values below 2^31).
inline VM8 Lt(VU8 a, VU8 b) { return VM8{_mm256_cmpgt_epi32(b.v, a.v)}; }
inline VM8 Gt(VU8 a, VU8 b) { return VM8{_mm256_cmpgt_epi32(a.v, b.v)}; }
inline VM8 Eq(VU8 a, VU8 b) { return VM8{_mm256_cmpeq_epi32(a.v, b.v)}; }
inline VF8 Select(VM8 m, VF8 a, VF8 b) {
  return VF8(_mm256_blendv_ps(b.v, a.v, _mm256_castsi256_ps(m.v)));
}
inline VU8 Select(VM8 m, VU8 a, VU8 b) {
  return VU8(_mm256_blendv_epi8(b.v, a.v, m.v));
}

// 32 x 32 -> 64-bit products of every lane with m: even lanes directly,
// odd lanes shifted down first; the halves are blended back into lanes.
inline VU8 MulHiLo(VU8 a, uint32_t m, VU8* hi) {
  const __m256i mv = _mm256_set1_epi64x(static_cast<long long>(m));
  const __m256i even = _mm256_mul_epu32(a.v, mv);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a.v, 32), mv);
  hi->v = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  return VU8(_mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA));
}

}  // namespace

template <>
struct FloatTraits<VF8> {
  using U = VU8;
  using M = VM8;
};

namespace {

// 8 x 32-bit lanes (values < 2^16) -> 8 x 16 bits, in lane order.
inline __m128i Pack16(VU8 r) {
  const __m256i packed = _mm256_packus_epi32(r.v, r.v);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

struct Avx2 {
  static constexpr int kWidth = 8;
  using F = VF8;
  using U = VU8;
  static U Iota() { return U(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

  template <Format kFormat>
  static void Put(typename Store<kFormat>::T* dst, F e) {
    if constexpr (kFormat == Format::kFloat32) {
      _mm256_storeu_ps(dst, e.v);
    } else if constexpr (kFormat == Format::kBFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                       Pack16(RoundToNarrow<BFloat16Format>(e)));
    } else if constexpr (kFormat == Format::kFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                       Pack16(RoundToNarrow<Float16Format>(e)));
    } else if constexpr (kFormat == Format::kFloat8E4M3FN) {
      const __m128i h = Pack16(RoundToNarrow<Float8E4M3FNFormat>(e));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(h, h));
    } else if constexpr (kFormat == Format::kFloat8E5M2) {
      const __m128i h = Pack16(RoundToNarrow<Float8E5M2Format>(e));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packus_epi16(h, h));
    }
  }
};

template <Dist kDist, Format kFormat>
struct Avx2Kernel {
  static void Run(const KernelParams& k, int64_t i0, int64_t n, void* out) {
    FillRunSimdErased<Avx2, kDist, kFormat>(k, i0, n, out);
  }
};

}  // namespace
}  // namespace MAT_PORTABLE_ISA

namespace internal {

FillRunFn Avx2FillRun(Dist dist, Format format) {
  return PickKernel<Avx2Kernel>(dist, format);
}

}  // namespace internal
}  // namespace materializer::init::portable

#else  // not an AVX2 build

namespace materializer::init::portable::internal {

FillRunFn Avx2FillRun(Dist dist, Format format) { return nullptr; }

}  // namespace materializer::init::portable::internal

#endif
