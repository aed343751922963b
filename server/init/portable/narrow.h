#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_NARROW_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_NARROW_H_

// float32 -> bfloat16 / float16 / float8_e4m3fn / float8_e5m2, rounding to
// nearest, ties to even, with integer operations and one float addition
// (for results below the format's smallest normal), so every target gives
// the same bits. Overflow and NaN follow torch's conversions (c10):
//   bfloat16, float16, float8_e5m2: too large -> inf, NaN -> NaN;
//   float8_e4m3fn (no inf): |x| >= 480 -> NaN (0x7f), as torch's .to().
// Generic over the float type F (scalar float or a SIMD vector); the result
// holds the narrow bits in the low bits of each 32-bit lane.

#include <cstdint>

#include "server/init/portable/exact_math.h"
#include "server/init/portable/hd.h"

namespace materializer::init::portable {
inline namespace MAT_PORTABLE_ISA {

// A narrow binary format: kMantissa fraction bits, exponent bias kBias;
// magnitudes whose float32 bits are >= kOverflowFrom become kOverflowBits
// (kNanBits for NaN).
template <int kBits, int kMantissa, int kBias, uint32_t kOverflowFrom,
          uint32_t kOverflowBits, uint32_t kNanBits>
struct NarrowFormat {
  static constexpr int bits = kBits;
  static constexpr int mantissa = kMantissa;
  static constexpr int bias = kBias;
  static constexpr uint32_t overflow_from = kOverflowFrom;
  static constexpr uint32_t overflow_bits = kOverflowBits;
  static constexpr uint32_t nan_bits = kNanBits;
};

using BFloat16Format = NarrowFormat<16, 7, 127, 0x7f800000u, 0x7f80u, 0x7fc0u>;
using Float16Format = NarrowFormat<16, 10, 15, 0x47800000u, 0x7c00u, 0x7e00u>;
using Float8E4M3FNFormat = NarrowFormat<8, 3, 7, 0x43f00000u, 0x7fu, 0x7fu>;
using Float8E5M2Format = NarrowFormat<8, 2, 15, 0x47800000u, 0x7cu, 0x7fu>;

// RNE(x) in Format, as bits in the low Format::bits of the result.
template <class Format, class F>
MAT_HD inline typename FloatTraits<F>::U RoundToNarrow(F x) {
  using U = typename FloatTraits<F>::U;
  constexpr int kShift = 23 - Format::mantissa;
  // Below this the result is subnormal in Format.
  constexpr uint32_t kMinNormal = uint32_t(127 - Format::bias + 1) << 23;
  // 2^(1 - bias - mantissa + 23) as float bits: a float whose ulp is the
  // Format's subnormal spacing, so adding it to |x| rounds |x| there (RNE),
  // and the sum's low bits are the Format's subnormal bits.
  constexpr uint32_t kDenormMagic = uint32_t((127 - Format::bias) + kShift + 1)
                                    << 23;
  constexpr uint32_t kRebias = uint32_t(Format::bias - 127) << 23;  // mod 2^32

  const U bits = AsU(x);
  if constexpr (Format::bias == 127 && Format::mantissa == 7) {
    // bfloat16 shares float32's exponent range: no rebias, and rounding the
    // low 16 bits of every non-NaN pattern (subnormal, normal, overflowing
    // into inf) is the same integer step, sign included. Equal to the
    // general path below, in fewer operations.
    const U magnitude = bits & U(0x7fffffffu);
    const U rounded = (bits + U(0x7fffu) + ((bits >> 16) & U(1u))) >> 16;
    return Select(Gt(magnitude, U(0x7f800000u)),
                  ((bits >> 16) & U(0x8000u)) | U(Format::nan_bits), rounded);
  }
  const U sign = bits & U(0x80000000u);
  const U magnitude = bits ^ sign;

  // Normal: rebias the exponent, then round the dropped bits to nearest,
  // ties to the even kept bit.
  const U odd = (magnitude >> kShift) & U(1u);
  const U normal =
      (magnitude + U(kRebias + ((1u << (kShift - 1)) - 1u)) + odd) >> kShift;
  // Subnormal in Format: one float addition does the rounding.
  const U subnormal =
      AsU(AsF(magnitude) + AsF(U(kDenormMagic))) - U(kDenormMagic);

  // magnitude < 2^31, so signed comparisons are unsigned ones.
  U result = Select(Lt(magnitude, U(kMinNormal)), subnormal, normal);
  result = Select(Lt(magnitude, U(Format::overflow_from)), result,
                  Select(Gt(magnitude, U(0x7f800000u)), U(Format::nan_bits),
                         U(Format::overflow_bits)));
  return result | (sign >> (32 - Format::bits));
}

}  // namespace MAT_PORTABLE_ISA
}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_NARROW_H_
