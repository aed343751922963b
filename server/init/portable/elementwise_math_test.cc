#include "server/init/portable/elementwise_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

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
  RunElementwiseF64(ops, leaf.data(), one.data(), leaf.size(), 1);
  RunElementwiseF64(ops, leaf.data(), four.data(), leaf.size(), 4);
  EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * 8), 0);
  EXPECT_EQ(one[5], Log1pF64(ExpF64(leaf[5])) + leaf[5]);
}

// The AVX2 build of the block loop (vectorized) and the generic one give
// the same bits, over every op kind and inputs across the domains.
TEST(Elementwise, VectorizedAndGenericBlocksAgree) {
  internal::ElementwiseBlockFn avx2 = internal::ElementwiseBlockAvx2();
  if (avx2 == nullptr || !__builtin_cpu_supports("avx2") ||
      !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "no AVX2 + FMA here";
  }
  const int64_t B = internal::kElementwiseBlock;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-800.0, 800.0);
  std::uniform_real_distribution<double> positive(0.0, 1.0);
  for (ElementwiseKind kind :
       {ElementwiseKind::kExp, ElementwiseKind::kExpm1, ElementwiseKind::kLog,
        ElementwiseKind::kLog1p, ElementwiseKind::kSoftplus,
        ElementwiseKind::kPow, ElementwiseKind::kSqrt,
        ElementwiseKind::kReciprocal}) {
    std::vector<ElementwiseOpDesc> ops(1);
    ops[0].kind = kind;
    ops[0].c = 1.7;
    std::vector<double> a(2 * B), b(2 * B);
    for (int64_t i = 0; i < B; ++i) {
      double x = dist(rng) / ((i % 3) + 1) / ((i % 7 == 0) ? 1000.0 : 1.0);
      if (kind == ElementwiseKind::kLog || kind == ElementwiseKind::kSqrt ||
          kind == ElementwiseKind::kPow) {
        x = std::fabs(x) * (i % 5 == 0 ? 1e-310 : 1.0);
      }
      if (kind == ElementwiseKind::kLog1p) x = positive(rng) * 3 - 0.9999;
      a[i] = b[i] = x;
    }
    internal::ElementwiseBlockGeneric(ops, a.data(), B);
    avx2(ops, b.data(), B);
    EXPECT_EQ(std::memcmp(a.data() + B, b.data() + B, B * 8), 0)
        << "kind " << static_cast<int>(kind);
  }
}

}  // namespace
}  // namespace materializer::init::portable
