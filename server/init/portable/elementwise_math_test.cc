#include "server/init/portable/elementwise_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/init/portable/elementwise.h"
#include "server/init/portable/elementwise_block.h"

namespace materializer::init::portable {
namespace {

// Units in the last place between a and b (same sign, finite).
int64_t Ulps(double a, double b) {
  int64_t ia, ib;
  std::memcpy(&ia, &a, 8);
  std::memcpy(&ib, &b, 8);
  return ia > ib ? ia - ib : ib - ia;
}

// The portable functions against glibc's (itself within 1 ulp of the true
// values): the figures docs/portable-rng.md section 14 states.
TEST(ElementwiseMath, CloseToLibmOverTheValidatedDomain) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-700.0, 700.0);
  std::uniform_real_distribution<double> unit(-0.999, 5.0);
  int64_t exp_ulps = 0, expm1_ulps = 0, log_ulps = 0, log1p_ulps = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = wide(rng);
    exp_ulps = std::max(exp_ulps, Ulps(ExpF64(x), std::exp(x)));
    const double s = x / 1000.0;
    expm1_ulps = std::max(expm1_ulps, Ulps(Expm1F64(s), std::expm1(s)));
    const double p = std::exp(x / 10.0);
    log_ulps = std::max(log_ulps, Ulps(LogAnyF64(p), std::log(p)));
    const double u = unit(rng);
    if (u != 0) log1p_ulps = std::max(log1p_ulps, Ulps(Log1pF64(u), std::log1p(u)));
  }
  // Measured: 1, 3, 2, 2 (docs/portable-rng.md, section 14).
  EXPECT_LE(exp_ulps, 2);
  EXPECT_LE(expm1_ulps, 4);
  EXPECT_LE(log_ulps, 3);
  EXPECT_LE(log1p_ulps, 3);
  std::printf("max ulps vs libm: exp %lld, expm1 %lld, log %lld, log1p %lld\n",
              static_cast<long long>(exp_ulps), static_cast<long long>(expm1_ulps),
              static_cast<long long>(log_ulps), static_cast<long long>(log1p_ulps));
}

// Units in the last place between float a and the float nearest b.
int64_t Ulps32(float a, double b) {
  const float fb = static_cast<float>(b);
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &fb, 4);
  return ia > ib ? int64_t{ia} - ib : int64_t{ib} - ia;
}

// The float32 functions against glibc's float64 ones rounded to float32
// (within 1 ulp of float32's true values): section 14's figures.
TEST(ElementwiseMath, Float32CloseToLibm) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> wide(-87.0f, 88.0f);
  std::uniform_real_distribution<float> unit(-0.999f, 5.0f);
  int64_t exp_ulps = 0, expm1_ulps = 0, log_ulps = 0, log1p_ulps = 0,
          softplus_ulps = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = wide(rng);
    exp_ulps = std::max(exp_ulps, Ulps32(ExpF32(x), std::exp(double{x})));
    const float s = x / 100.0f;
    expm1_ulps =
        std::max(expm1_ulps, Ulps32(Expm1F32(s), std::expm1(double{s})));
    const float p = std::exp(x);
    if (p > 0 && std::isfinite(p)) {
      log_ulps = std::max(log_ulps, Ulps32(LogAnyF32(p), std::log(double{p})));
    }
    const float u = unit(rng);
    if (u != 0) {
      log1p_ulps =
          std::max(log1p_ulps, Ulps32(Log1pF32(u), std::log1p(double{u})));
    }
    const float t = x / 4.0f;
    softplus_ulps = std::max(
        softplus_ulps,
        Ulps32(SoftplusF32(t), t > 20 ? t : std::log1p(std::exp(double{t}))));
  }
  std::printf(
      "float32 max ulps vs libm: exp %lld, expm1 %lld, log %lld, log1p %lld, "
      "softplus %lld\n",
      static_cast<long long>(exp_ulps), static_cast<long long>(expm1_ulps),
      static_cast<long long>(log_ulps), static_cast<long long>(log1p_ulps),
      static_cast<long long>(softplus_ulps));
  // Within the 4 ulps per op that validation's bounds allow
  // (server/init/elementwise.cc, Widen).
  EXPECT_LE(exp_ulps, 2);
  EXPECT_LE(expm1_ulps, 3);
  EXPECT_LE(log_ulps, 2);
  EXPECT_LE(log1p_ulps, 3);
  EXPECT_LE(softplus_ulps, 4);
}

TEST(ElementwiseMath, Float32EdgesAsSpecified) {
  EXPECT_EQ(ExpF32(-104.0f), 0.0f);
  EXPECT_GT(ExpF32(-103.0f), 0.0f);  // a subnormal, rounded once
  EXPECT_TRUE(std::isinf(ExpF32(89.0f)));
  EXPECT_TRUE(std::isinf(ExpF32(88.8f)));
  EXPECT_FALSE(std::isinf(ExpF32(88.7f)));
  EXPECT_EQ(ExpF32(0.0f), 1.0f);
  EXPECT_EQ(Expm1F32(0.0f), 0.0f);
  EXPECT_EQ(LogAnyF32(1.0f), 0.0f);
  EXPECT_NEAR(LogAnyF32(1e-40f), std::log(1e-40), 1e-5);
  EXPECT_EQ(Log1pF32(1e-30f), 1e-30f);
  EXPECT_EQ(PowF32(-2.0f, 3.0f), -8.0f);
  EXPECT_NEAR(PowF32(-2.0f, 9.0f), -512.0f, 1e-3);
  EXPECT_NEAR(PowF32(-2.0f, 10.0f), 1024.0f, 1e-3);
  EXPECT_EQ(SoftplusF32(30.0f), 30.0f);
}

TEST(ElementwiseMath, EdgesAsSpecified) {
  EXPECT_EQ(ExpF64(-746.0), 0.0);
  EXPECT_TRUE(std::isinf(ExpF64(710.0)));
  EXPECT_EQ(ExpF64(0.0), 1.0);
  EXPECT_GT(ExpF64(-745.0), 0.0);  // a subnormal, rounded once
  EXPECT_EQ(Log1pF64(1e-300), 1e-300);
  EXPECT_NEAR(LogAnyF64(1e-310), std::log(1e-310), 1e-12);
  EXPECT_EQ(PowF64(-2.0, 3.0), -8.0);
  EXPECT_NEAR(PowF64(-2.0, 4.5 * 2), -512.0, 1e-9);
  EXPECT_EQ(SoftplusF64(30.0), 30.0);
}

TEST(Elementwise, ThreadsDoNotChangeTheBits) {
  std::vector<ElementwiseOpDesc> ops(3);
  ops[0].kind = ElementwiseKind::kExp;
  ops[1].kind = ElementwiseKind::kLog1p;
  ops[1].x = 1;
  ops[2].kind = ElementwiseKind::kAdd;
  ops[2].x = 2;
  ops[2].y = 0;
  std::vector<double> leaf(300000);
  for (size_t i = 0; i < leaf.size(); ++i) leaf[i] = std::sin(0.001 * i);
  std::vector<double> one(leaf.size()), four(leaf.size());
  RunElementwise(ops, leaf.data(), one.data(), leaf.size(), 1);
  RunElementwise(ops, leaf.data(), four.data(), leaf.size(), 4);
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * 8), 0);
  EXPECT_EQ(one[5], Log1pF64(ExpF64(leaf[5])) + leaf[5]);
}

// In place (the server's way: the leaf is the tensor) equals into another
// buffer, whether or not the last op reads the leaf itself.
TEST(Elementwise, InPlaceEqualsOutOfPlace) {
  std::vector<ElementwiseOpDesc> reads_leaf_last(2), plain(2);
  reads_leaf_last[0].kind = ElementwiseKind::kExp;
  reads_leaf_last[1].kind = ElementwiseKind::kAdd;
  reads_leaf_last[1].x = 1;
  reads_leaf_last[1].y = 0;  // exp(v) + v
  plain[0].kind = ElementwiseKind::kNeg;
  plain[1].kind = ElementwiseKind::kExp;
  plain[1].x = 1;
  for (const auto& ops : {reads_leaf_last, plain}) {
    std::vector<float> leaf(70000);
    for (size_t i = 0; i < leaf.size(); ++i) {
      leaf[i] = static_cast<float>(std::sin(0.01 * i));
    }
    std::vector<float> out(leaf.size());
    RunElementwise(ops, leaf.data(), out.data(), leaf.size(), 2);
    RunElementwise(ops, leaf.data(), leaf.data(), leaf.size(), 2);
    EXPECT_EQ(std::memcmp(out.data(), leaf.data(), out.size() * 4), 0);
    const float x3 = static_cast<float>(std::sin(0.03));
    EXPECT_EQ(out[3], ops[1].y == 0 ? ExpF32(x3) + x3 : ExpF32(-x3));
  }
}

// The AVX2 build of the range loop (vectorized) and the generic one give
// the same bits, over every op kind and inputs across the domains, for
// float64 and float32 leaves (the widening and narrowing run in the same
// builds).
TEST(Elementwise, VectorizedAndGenericBuildsAgree) {
  const internal::ElementwiseKernels avx2 = internal::ElementwiseKernelsAvx2();
  if (avx2.f64 == nullptr || !__builtin_cpu_supports("avx2") ||
      !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "no AVX2 + FMA here";
  }
  const internal::ElementwiseKernels generic =
      internal::ElementwiseKernelsGeneric();
  // Two blocks and a partial one.
  const int64_t n = 2 * internal::kElementwiseBlock + 77;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-800.0, 800.0);
  std::uniform_real_distribution<double> positive(0.0, 1.0);
  struct Case {
    ElementwiseKind kind;
    bool constant_first = false;
    bool has_min = false, has_max = false;
  };
  for (const Case& c : std::vector<Case>{
           {ElementwiseKind::kExp}, {ElementwiseKind::kExpm1},
           {ElementwiseKind::kLog}, {ElementwiseKind::kLog1p},
           {ElementwiseKind::kSoftplus}, {ElementwiseKind::kPow},
           {ElementwiseKind::kSqrt}, {ElementwiseKind::kReciprocal},
           {ElementwiseKind::kDiv}, {ElementwiseKind::kDiv, true},
           {ElementwiseKind::kSub, true}, {ElementwiseKind::kNeg},
           {ElementwiseKind::kClamp, false, true, false},
           {ElementwiseKind::kClamp, false, false, true},
           {ElementwiseKind::kClamp, false, true, true}}) {
    std::vector<ElementwiseOpDesc> ops(1);
    ops[0].kind = c.kind;
    ops[0].c = 1.7;
    ops[0].constant_first = c.constant_first;
    ops[0].has_min = c.has_min;
    ops[0].has_max = c.has_max;
    ops[0].min = -3.5;
    ops[0].max = 2.25;
    std::vector<double> leaf(n);
    for (int64_t i = 0; i < n; ++i) {
      double x = dist(rng) / ((i % 3) + 1) / ((i % 7 == 0) ? 1000.0 : 1.0);
      if (c.kind == ElementwiseKind::kLog || c.kind == ElementwiseKind::kSqrt ||
          c.kind == ElementwiseKind::kPow) {
        x = std::fabs(x) * (i % 5 == 0 ? 1e-310 : 1.0);
      }
      if (c.kind == ElementwiseKind::kLog1p) x = positive(rng) * 3 - 0.9999;
      leaf[i] = x;
    }
    std::vector<double> regs(2 * internal::kElementwiseBlock);
    std::vector<double> a(n), b(n);
    generic.f64(ops, leaf.data(), a.data(), n, regs.data());
    avx2.f64(ops, leaf.data(), b.data(), n, regs.data());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 8), 0)
        << "kind " << static_cast<int>(c.kind);
    std::vector<float> leaf32(leaf.begin(), leaf.end()), a32(n), b32(n);
    generic.f32(ops, leaf32.data(), a32.data(), n, regs.data());
    avx2.f32(ops, leaf32.data(), b32.data(), n, regs.data());
    EXPECT_EQ(std::memcmp(a32.data(), b32.data(), n * 4), 0)
        << "kind " << static_cast<int>(c.kind) << " (float32)";
    // And both are the definition, element by element.
    for (int64_t i = 0; i < n; i += 37) {
      const double want = ApplyElementwiseOp(ops[0], leaf[i], ops[0].c);
      if (!std::isnan(want)) {
        EXPECT_EQ(std::memcmp(&a[i], &want, 8), 0)
            << "kind " << static_cast<int>(c.kind) << " at " << leaf[i];
      }
      const float want32 = ApplyElementwiseOp(
          ops[0], leaf32[i], static_cast<float>(ops[0].c));
      if (!std::isnan(want32)) {
        EXPECT_EQ(std::memcmp(&a32[i], &want32, 4), 0)
            << "kind " << static_cast<int>(c.kind) << " at " << leaf32[i]
            << " (float32)";
      }
    }
  }
}

}  // namespace
}  // namespace materializer::init::portable
