#include "server/init/portable/host_math.h"

#include <cmath>

#include "gtest/gtest.h"

namespace materializer::init::portable {
namespace {

TEST(HostMathTest, ExpMatchesLibm) {
  // Normal results (subnormal ones are exact to within their spacing).
  for (double x = -700.0; x <= 0.0; x += 0.01171875) {
    const double want = std::exp(x);
    EXPECT_NEAR(PortableExp(x), want, 4e-16 * want) << x;
  }
  EXPECT_EQ(PortableExp(0.0), 1.0);
  EXPECT_EQ(PortableExp(-800.0), 0.0);
}

TEST(HostMathTest, ErfMatchesLibm) {
  for (double x = -7.0; x <= 7.0; x += 0.0009765625) {
    const double want = std::erf(x);
    EXPECT_NEAR(PortableErf(x), want, 4e-15) << x;
    if (std::fabs(x) > 1e-3) {
      EXPECT_NEAR(PortableErf(x), want, 3e-15 * std::fabs(want)) << x;
    }
  }
  EXPECT_EQ(PortableErf(0.0), 0.0);
  EXPECT_EQ(PortableErf(6.0), 1.0);
  EXPECT_EQ(PortableErf(-1e300), -1.0);
  EXPECT_EQ(PortableErf(1e-300), std::erf(1e-300));
}

}  // namespace
}  // namespace materializer::init::portable
