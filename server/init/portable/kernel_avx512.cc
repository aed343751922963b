// The AVX-512 kernel: 16 Philox blocks per vector, one vector per group
// word. Compiled with -mavx512f -mfma (BUILD.bazel); portable.cc calls it
// only on CPUs (and kernels) with AVX-512F. The arithmetic is
// exact_math.h's, so its bits equal the scalar path's (portable_test
// checks every path the CPU it runs on has).

#include "server/init/portable/cpu_kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)

#include <immintrin.h>

#include "server/init/portable/generate.h"
#include "server/init/portable/kernel_table.h"
#include "server/init/portable/simd_run.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {
namespace {

struct VU16 {
  __m512i v;
  VU16() = default;
  VU16(uint32_t x) : v(_mm512_set1_epi32(static_cast<int>(x))) {}
  explicit VU16(__m512i x) : v(x) {}
};
struct VF16 {
  __m512 v;
  VF16() = default;
  VF16(float x) : v(_mm512_set1_ps(x)) {}
  explicit VF16(__m512 x) : v(x) {}
};
struct VM16 {
  __mmask16 m;
};

inline VF16 operator+(VF16 a, VF16 b) { return VF16(_mm512_add_ps(a.v, b.v)); }
inline VF16 operator-(VF16 a, VF16 b) { return VF16(_mm512_sub_ps(a.v, b.v)); }
inline VF16 operator*(VF16 a, VF16 b) { return VF16(_mm512_mul_ps(a.v, b.v)); }
inline VF16 Div(VF16 a, VF16 b) { return VF16(_mm512_div_ps(a.v, b.v)); }
inline VF16 Fma(VF16 a, VF16 b, VF16 c) {
  return VF16(_mm512_fmadd_ps(a.v, b.v, c.v));
}
inline VF16 Sqrt(VF16 a) { return VF16(_mm512_sqrt_ps(a.v)); }
inline VF16 Neg(VF16 a) {
  return VF16(_mm512_castsi512_ps(_mm512_xor_si512(
      _mm512_castps_si512(a.v), _mm512_set1_epi32(int(0x80000000u)))));
}

inline VU16 operator+(VU16 a, VU16 b) {
  return VU16(_mm512_add_epi32(a.v, b.v));
}
inline VU16 operator-(VU16 a, VU16 b) {
  return VU16(_mm512_sub_epi32(a.v, b.v));
}
inline VU16 operator^(VU16 a, VU16 b) {
  return VU16(_mm512_xor_si512(a.v, b.v));
}
inline VU16 operator&(VU16 a, VU16 b) {
  return VU16(_mm512_and_si512(a.v, b.v));
}
inline VU16 operator|(VU16 a, VU16 b) {
  return VU16(_mm512_or_si512(a.v, b.v));
}
inline VU16 operator>>(VU16 a, int s) {
  return VU16(_mm512_srli_epi32(a.v, static_cast<unsigned>(s)));
}
inline VU16 operator<<(VU16 a, int s) {
  return VU16(_mm512_slli_epi32(a.v, static_cast<unsigned>(s)));
}

inline VU16 AsU(VF16 a) { return VU16(_mm512_castps_si512(a.v)); }
inline VF16 AsF(VU16 a) { return VF16(_mm512_castsi512_ps(a.v)); }
inline VF16 ToFloat(VU16 a) { return VF16(_mm512_cvtepi32_ps(a.v)); }

inline VM16 Lt(VF16 a, VF16 b) {
  return VM16{_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)};
}
inline VM16 Gt(VF16 a, VF16 b) {
  return VM16{_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)};
}
// Signed 32-bit comparisons (callers compare values below 2^31).
inline VM16 Lt(VU16 a, VU16 b) {
  return VM16{_mm512_cmplt_epi32_mask(a.v, b.v)};
}
inline VM16 Gt(VU16 a, VU16 b) {
  return VM16{_mm512_cmpgt_epi32_mask(a.v, b.v)};
}
inline VM16 Eq(VU16 a, VU16 b) {
  return VM16{_mm512_cmpeq_epi32_mask(a.v, b.v)};
}
// m ? a : b, lane by lane.
inline VF16 Select(VM16 m, VF16 a, VF16 b) {
  return VF16(_mm512_mask_blend_ps(m.m, b.v, a.v));
}
inline VU16 Select(VM16 m, VU16 a, VU16 b) {
  return VU16(_mm512_mask_blend_epi32(m.m, b.v, a.v));
}

inline VU16 MulHiLo(VU16 a, uint32_t m, VU16* hi) {
  const __m512i mv = _mm512_set1_epi64(static_cast<long long>(m));
  const __m512i even = _mm512_mul_epu32(a.v, mv);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a.v, 32), mv);
  hi->v = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  return VU16(
      _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32)));
}

}  // namespace

template <>
struct FloatTraits<VF16> {
  using U = VU16;
  using M = VM16;
};

namespace {

struct Avx512 {
  static constexpr int kWidth = 16;
  using F = VF16;
  using U = VU16;
  static U Iota() {
    return U(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                               15));
  }

  template <Format kFormat>
  static void Put(typename Store<kFormat>::T* dst, F e) {
    if constexpr (kFormat == Format::kFloat32) {
      _mm512_storeu_ps(dst, e.v);
    } else if constexpr (kFormat == Format::kBFloat16) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(dst),
          _mm512_cvtepi32_epi16(RoundToNarrow<BFloat16Format>(e).v));
    } else if constexpr (kFormat == Format::kFloat16) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(dst),
          _mm512_cvtepi32_epi16(RoundToNarrow<Float16Format>(e).v));
    } else if constexpr (kFormat == Format::kFloat8E4M3FN) {
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(dst),
          _mm512_cvtepi32_epi8(RoundToNarrow<Float8E4M3FNFormat>(e).v));
    } else if constexpr (kFormat == Format::kFloat8E5M2) {
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(dst),
          _mm512_cvtepi32_epi8(RoundToNarrow<Float8E5M2Format>(e).v));
    }
  }
};

template <Dist kDist, Format kFormat>
struct Avx512Kernel {
  static void Run(const KernelParams& k, int64_t i0, int64_t n, void* out) {
    FillRunSimdErased<Avx512, kDist, kFormat>(k, i0, n, out);
  }
};

}  // namespace
}  // namespace MAT_PORTABLE_ISA

namespace internal {

FillRunFn Avx512FillRun(Dist dist, Format format) {
  return PickKernel<Avx512Kernel>(dist, format);
}

}  // namespace internal
}  // namespace materializer::init::portable

#else  // not an AVX-512 build

namespace materializer::init::portable::internal {

FillRunFn Avx512FillRun(Dist dist, Format format) { return nullptr; }

}  // namespace materializer::init::portable::internal

#endif
