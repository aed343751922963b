#include "server/init/portable/exact_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>

#include "gtest/gtest.h"

namespace materializer::init::portable {
namespace {

// Accuracy of the project's own log, sin(pi x), cos(pi x) and erfinv,
// measured against libm in a wider type (double for the float32 functions,
// long double for the float64 ones) over a sweep of every k-th
// representable input. The bounds are the measured maxima rounded up; the
// figures are printed and recorded (docs/portable-rng.md, "Accuracy").
// Exactness across targets matters more than the last ulp: these bound how
// far the portable values are from the ideal ones, not whether two targets
// agree (portable_test and the NumPy reference check that).

double UlpF32(long double ref) {
  const float r = static_cast<float>(std::fabs(ref));
  if (r == 0 || r < 0x1p-126f) return 0x1p-149;
  return std::ldexp(1.0, std::ilogb(r) - 23);
}
long double UlpF64(long double ref) {
  const double r = static_cast<double>(std::fabs(ref));
  if (r == 0 || r < 0x1p-1022) return 0x1p-1074L;
  return std::ldexp(1.0L, std::ilogb(r) - 52);
}

struct Sweep {
  double max_ulp = 0;
  double worst_input = 0;
  int64_t count = 0;
};

// About `samples` floats of [lo, hi], evenly spaced in bit patterns (so
// every binade is visited), plus hi; for lo < 0, both signs.
Sweep SweepF32(float lo, float hi, uint32_t samples,
               const std::function<float(float)>& f,
               const std::function<long double(float)>& ref) {
  Sweep s;
  auto visit = [&](float x) {
    const long double want = ref(x);
    const double err = static_cast<double>(
        std::fabs(static_cast<long double>(f(x)) - want) / UlpF32(want));
    ++s.count;
    if (err > s.max_ulp) {
      s.max_ulp = err;
      s.worst_input = x;
    }
  };
  uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  if (lo >= 0) {
    const uint64_t stride = std::max<uint64_t>(1, (uint64_t{b} - a) / samples);
    for (uint64_t u = a; u <= b; u += stride) {
      float x;
      const uint32_t bits = static_cast<uint32_t>(u);
      std::memcpy(&x, &bits, 4);
      visit(x);
    }
  } else {
    // lo < 0 <= hi: sweep [0, -lo] negated and [0, hi].
    Sweep neg = SweepF32(
        0, -lo, samples, [&](float x) { return f(-x); },
        [&](float x) { return ref(-x); });
    Sweep pos = SweepF32(0, hi, samples, f, ref);
    s = neg.max_ulp > pos.max_ulp ? neg : pos;
    if (s.worst_input == neg.worst_input && neg.max_ulp > pos.max_ulp) {
      s.worst_input = -s.worst_input;
    }
    s.count = neg.count + pos.count;
    return s;
  }
  visit(hi);
  return s;
}

Sweep SweepF64(double lo, double hi, int64_t samples,
               const std::function<double(double)>& f,
               const std::function<long double(double)>& ref) {
  Sweep s;
  for (int64_t k = 0; k <= samples; ++k) {
    const double x = lo + (hi - lo) * static_cast<double>(k) / samples;
    const long double want = ref(x);
    const double err = static_cast<double>(
        std::fabs(static_cast<long double>(f(x)) - want) / UlpF64(want));
    ++s.count;
    if (err > s.max_ulp) {
      s.max_ulp = err;
      s.worst_input = x;
    }
  }
  return s;
}

void Report(const char* name, const Sweep& s) {
  std::printf("%-28s max %.3f ulp at %a over %lld inputs\n", name, s.max_ulp,
              s.worst_input, static_cast<long long>(s.count));
  ::testing::Test::RecordProperty(name, std::to_string(s.max_ulp));
}

// erfinv in long double: Newton steps from our own estimate, on erf near 0
// and on erfc in the tails (where 1 - |x| is exact and erf cannot resolve
// the answer).
long double ErfInvRef(long double x, long double start) {
  const long double sign = x < 0 ? -1.0L : 1.0L;
  const long double a = std::fabs(x);
  long double y = std::fabs(start);
  for (int i = 0; i < 6; ++i) {
    const long double slope =
        2.0L / std::sqrt(3.141592653589793238462643L) * std::exp(-y * y);
    if (a < 0.5L) {
      y -= (std::erf(y) - a) / slope;
    } else {
      y += (std::erfc(y) - (1.0L - a)) / slope;
    }
  }
  return sign * y;
}

TEST(ExactMathTest, LogF32) {
  // The Box-Muller argument range, and a wide one.
  const Sweep box = SweepF32(
      0x1p-24f, 1.0f, 3000000, [](float x) { return LogF32(x); },
      [](float x) { return std::log(static_cast<long double>(x)); });
  Report("log_f32 [2^-24, 1]", box);
  EXPECT_LE(box.max_ulp, 2.5);
  const Sweep wide = SweepF32(
      0x1p-126f, 0x1p+64f, 2000000, [](float x) { return LogF32(x); },
      [](float x) { return std::log(static_cast<long double>(x)); });
  Report("log_f32 [2^-126, 2^64]", wide);
  EXPECT_LE(wide.max_ulp, 2.5);
}

TEST(ExactMathTest, SinCosPiF32) {
  const Sweep sin = SweepF32(
      -0.25f, 0.25f, 1500000,
      [](float x) {
        float s, c;
        SinCosPiF32(x, &s, &c);
        return s;
      },
      [](float x) {
        return std::sin(3.141592653589793238462643L *
                        static_cast<long double>(x));
      });
  Report("sinpi_f32 [-1/4, 1/4]", sin);
  EXPECT_LE(sin.max_ulp, 2.0);
  const Sweep cos = SweepF32(
      -0.25f, 0.25f, 1500000,
      [](float x) {
        float s, c;
        SinCosPiF32(x, &s, &c);
        return c;
      },
      [](float x) {
        return std::cos(3.141592653589793238462643L *
                        static_cast<long double>(x));
      });
  Report("cospi_f32 [-1/4, 1/4]", cos);
  EXPECT_LE(cos.max_ulp, 2.0);
}

TEST(ExactMathTest, ErfInvF32) {
  const Sweep s = SweepF32(
      -1.0f + 0x1p-24f, 1.0f - 0x1p-24f, 1000000,
      [](float x) { return ErfInvF32(x); },
      [](float x) {
        return ErfInvRef(x, static_cast<long double>(ErfInvF32(x)));
      });
  Report("erfinv_f32 (-1, 1)", s);
  EXPECT_LE(s.max_ulp, 4.0);
  const Sweep tail = SweepF32(
      0.99f, 1.0f - 0x1p-24f, 200000, [](float x) { return ErfInvF32(x); },
      [](float x) {
        return ErfInvRef(x, static_cast<long double>(ErfInvF32(x)));
      });
  Report("erfinv_f32 [0.99, 1)", tail);
  EXPECT_LE(tail.max_ulp, 4.0);
  // x = +-1 (only rounding produces them) gives a finite quantile.
  EXPECT_TRUE(std::isfinite(ErfInvF32(1.0f)));
  EXPECT_GT(ErfInvF32(1.0f), 3.8f);
  EXPECT_EQ(ErfInvF32(-1.0f), -ErfInvF32(1.0f));
  EXPECT_EQ(ErfInvF32(0.0f), 0.0f);
}

TEST(ExactMathTest, LogF64) {
  const Sweep s = SweepF64(
      0x1p-53, 1.0, 1000000, [](double x) { return LogF64(x); },
      [](double x) { return std::log(static_cast<long double>(x)); });
  Report("log_f64 [2^-53, 1]", s);
  EXPECT_LE(s.max_ulp, 2.5);
  // Small arguments, where the sweep above is sparse.
  const Sweep tiny = SweepF64(
      0x1p-53, 0x1p-40, 100000, [](double x) { return LogF64(x); },
      [](double x) { return std::log(static_cast<long double>(x)); });
  Report("log_f64 [2^-53, 2^-40]", tiny);
  EXPECT_LE(tiny.max_ulp, 2.5);
}

TEST(ExactMathTest, SinCosPiF64) {
  const long double kPi = 3.141592653589793238462643L;
  const Sweep sin = SweepF64(
      -0.25, 0.25, 1000001,
      [](double x) {
        double s, c;
        SinCosPiF64(x, &s, &c);
        return s;
      },
      [&](double x) { return std::sin(kPi * static_cast<long double>(x)); });
  Report("sinpi_f64 [-1/4, 1/4]", sin);
  EXPECT_LE(sin.max_ulp, 2.0);
  const Sweep cos = SweepF64(
      -0.25, 0.25, 1000001,
      [](double x) {
        double s, c;
        SinCosPiF64(x, &s, &c);
        return c;
      },
      [&](double x) { return std::cos(kPi * static_cast<long double>(x)); });
  Report("cospi_f64 [-1/4, 1/4]", cos);
  EXPECT_LE(cos.max_ulp, 2.0);
}

TEST(ExactMathTest, ErfInvF64) {
  const Sweep s = SweepF64(
      -1.0 + 0x1p-53, 1.0 - 0x1p-53, 300001,
      [](double x) { return ErfInvF64(x); },
      [](double x) {
        return ErfInvRef(x, static_cast<long double>(ErfInvF64(x)));
      });
  Report("erfinv_f64 (-1, 1)", s);
  EXPECT_LE(s.max_ulp, 4.0);
  // The tails, where the sweep above is sparse.
  const Sweep tail = SweepF64(
      1.0 - 0x1p-20, 1.0 - 0x1p-53, 300000,
      [](double x) { return ErfInvF64(x); },
      [](double x) {
        return ErfInvRef(x, static_cast<long double>(ErfInvF64(x)));
      });
  Report("erfinv_f64 [1-2^-20, 1)", tail);
  EXPECT_LE(tail.max_ulp, 4.0);
  EXPECT_TRUE(std::isfinite(ErfInvF64(1.0)));
}

}  // namespace
}  // namespace materializer::init::portable
