#include "server/init/portable/narrow.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace materializer::init::portable {
namespace {

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// The inputs: every 97th bit pattern (all binades, both signs, inf and
// NaNs included) plus every pattern within 2^12 of each binade boundary
// (where rounding carries into the exponent).
std::vector<uint32_t> Inputs() {
  std::vector<uint32_t> out;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 97) out.push_back(uint32_t(u));
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (int32_t d = -4096; d < 4096; ++d) {
        const int64_t bits = (int64_t{e} << 23) + d;
        if (bits >= 0 && bits <= 0x7fffffff)
          out.push_back(sign | uint32_t(bits));
      }
    }
  }
  return out;
}

// Independent reference: the representable magnitudes of a narrow format,
// code by code; the nearest one wins, ties to the even code (the code's low
// bit is the significand's). Overflow and NaN as torch's conversions.
class TableRound {
 public:
  TableRound(int mantissa, int bias, int max_code, double overflow_from,
             uint32_t overflow_bits, uint32_t nan_bits, int bits)
      : overflow_from_(overflow_from),
        overflow_bits_(overflow_bits),
        nan_bits_(nan_bits),
        bits_(bits) {
    for (int code = 0; code <= max_code; ++code) {
      const int e = code >> mantissa;
      const int m = code & ((1 << mantissa) - 1);
      values_.push_back(
          e == 0 ? std::ldexp(m, 1 - bias - mantissa)
                 : std::ldexp((1 << mantissa) + m, e - bias - mantissa));
    }
  }
  uint32_t operator()(float x) const {
    const uint32_t sign = std::signbit(x) ? 1u << (bits_ - 1) : 0u;
    if (std::isnan(x)) return sign | nan_bits_;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= overflow_from_) return sign | overflow_bits_;
    size_t best = 0;
    for (size_t k = 1; k < values_.size(); ++k) {
      const double d = std::fabs(values_[k] - a);
      const double best_d = std::fabs(values_[best] - a);
      if (d < best_d || (d == best_d && (k % 2) == 0)) best = k;
    }
    return sign | uint32_t(best);
  }

 private:
  std::vector<double> values_;
  double overflow_from_;
  uint32_t overflow_bits_, nan_bits_;
  int bits_;
};

template <class Format>
void ExpectMatches(const TableRound& reference, uint32_t step) {
  const std::vector<uint32_t> inputs = Inputs();
  int64_t checked = 0;
  for (size_t k = 0; k < inputs.size(); k += step) {
    const float x = FromBits(inputs[k]);
    const uint32_t got = RoundToNarrow<Format>(x);
    const uint32_t want = reference(x);
    ASSERT_EQ(got, want) << "x = " << std::hexfloat << x << " (bits "
                         << std::hex << inputs[k] << ")";
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

TEST(NarrowTest, Float8E4M3FNMatchesTable) {
  // Codes 0..0x7f, where 0x7f (the value 480 if it existed) is NaN: so
  // |x| > 464 rounds to NaN, 464 (a tie) to 448; |x| >= 480 is NaN. As
  // torch's .to(float8_e4m3fn).
  ExpectMatches<Float8E4M3FNFormat>(
      TableRound(3, 7, 0x7f, 480.0, 0x7f, 0x7f, 8), 7);
}

TEST(NarrowTest, Float8E5M2MatchesTable) {
  // 0..0x7b; |x| >= 61440 (57344 + half an ulp) -> inf 0x7c.
  ExpectMatches<Float8E5M2Format>(
      TableRound(2, 15, 0x7b, 61440.0, 0x7c, 0x7f, 8), 7);
}

TEST(NarrowTest, BFloat16MatchesNeighbourRounding) {
  // bfloat16 is float32's top half: the candidates are the truncation and
  // the next value up; nearest wins, ties to the even one.
  for (uint32_t bits : Inputs()) {
    const float x = FromBits(bits);
    uint32_t want;
    if (std::isnan(x)) {
      want = (bits >> 16 & 0x8000u) | 0x7fc0u;
    } else if (std::isinf(x)) {
      want = bits >> 16;
    } else {
      const uint32_t down = bits & 0xffff0000u;
      const uint32_t up = down + 0x10000u;  // may become inf: right
      const double dd = std::fabs(double(FromBits(down)) - x);
      const double du = std::isinf(FromBits(up)) && !std::isinf(x)
                            ? std::fabs(std::ldexp(1.0, 128) - std::fabs(x))
                            : std::fabs(double(FromBits(up)) - x);
      want = (dd < du || (dd == du && ((down >> 16) & 1) == 0)) ? down >> 16
                                                                : up >> 16;
    }
    ASSERT_EQ(RoundToNarrow<BFloat16Format>(x), want)
        << std::hexfloat << x << " bits " << std::hex << bits;
  }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HardwareHalf(float x) {
  return static_cast<uint16_t>(
      _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c").
bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

TEST(NarrowTest, Float16MatchesF16cHardware) {
  if (!CpuHasF16c()) {
    GTEST_SKIP() << "this CPU has no F16C conversion instructions";
  }
  for (uint32_t bits : Inputs()) {
    const float x = FromBits(bits);
    if (std::isnan(x)) continue;  // hardware keeps NaN payloads; we do not
    ASSERT_EQ(RoundToNarrow<Float16Format>(x), HardwareHalf(x))
        << std::hexfloat << x << " bits " << std::hex << bits;
  }
}
#endif

TEST(NarrowTest, SignsSpecialValuesAndSubnormals) {
  EXPECT_EQ(RoundToNarrow<Float16Format>(-0.0f), 0x8000u);
  EXPECT_EQ(RoundToNarrow<Float16Format>(65504.0f), 0x7bffu);
  EXPECT_EQ(RoundToNarrow<Float16Format>(65520.0f), 0x7c00u);  // tie -> inf
  EXPECT_EQ(RoundToNarrow<Float16Format>(0x1p-24f), 0x0001u);  // min subnormal
  EXPECT_EQ(RoundToNarrow<Float16Format>(0x1p-25f), 0x0000u);  // tie -> even 0
  EXPECT_EQ(RoundToNarrow<BFloat16Format>(-INFINITY), 0xff80u);
  EXPECT_EQ(RoundToNarrow<Float8E4M3FNFormat>(448.0f), 0x7eu);
  EXPECT_EQ(RoundToNarrow<Float8E4M3FNFormat>(464.0f), 0x7eu);  // tie -> even
  EXPECT_EQ(RoundToNarrow<Float8E4M3FNFormat>(-480.0f), 0xffu);
  EXPECT_EQ(RoundToNarrow<Float8E4M3FNFormat>(0x1p-9f), 0x01u);
  EXPECT_EQ(RoundToNarrow<Float8E5M2Format>(57344.0f), 0x7bu);
  EXPECT_EQ(RoundToNarrow<Float8E5M2Format>(-INFINITY), 0xfcu);
  EXPECT_EQ(RoundToNarrow<Float8E5M2Format>(0x1p-16f), 0x01u);
}

}  // namespace
}  // namespace materializer::init::portable
