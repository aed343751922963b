#include "server/init/portable/host_math.h"

#include <cmath>

namespace materializer::init::portable {
namespace {

constexpr double kInvLn2 = 0x1.71547652b82fep+0;
constexpr double kLn2Hi = 0x1.62e42fee00000p-1;  // 33 significant bits
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kTwoOverSqrtPi = 0x1.20dd750429b6dp+0;
constexpr int kExpTerms = 14;   // Taylor terms 0..13; |r| <= 0.35
constexpr int kErfTerms = 140;  // enough for |x| < 6 (2x^2 < 72)

}  // namespace

double PortableExp(double x) {
  if (x < -745.0) return 0.0;
  // x = k ln2 + r, |r| <= ln2 / 2 (k ln2_hi is exact for |k| < 2^20).
  const double k = std::floor(x * kInvLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // sum_{j <= 13} r^j / j!, Horner from j = 13 down, 1/j! = 1.0 / j!.
  double factorial = 1.0;
  double inverse_factorials[kExpTerms];
  for (int j = 0; j < kExpTerms; ++j) {
    if (j > 0) factorial *= j;
    inverse_factorials[j] = 1.0 / factorial;
  }
  double p = inverse_factorials[kExpTerms - 1];
  for (int j = kExpTerms - 2; j >= 0; --j) p = p * r + inverse_factorials[j];
  return std::ldexp(p, static_cast<int>(k));
}

double PortableErf(double x) {
  const double a = std::fabs(x);
  if (a >= 6.0) return std::copysign(1.0, x);
  // erf(a) = 2/sqrt(pi) e^(-a^2) sum_n 2^n a^(2n+1) / (1 3 5 ... (2n+1)):
  // positive terms, no cancellation.
  const double a2 = a * a;
  double term = a;
  double sum = a;
  for (int n = 1; n < kErfTerms; ++n) {
    term = term * (a2 + a2) / (2 * n + 1);
    sum = sum + term;
  }
  double r = sum * kTwoOverSqrtPi * PortableExp(-a2);
  if (r > 1.0) r = 1.0;
  return std::copysign(r, x);
}

}  // namespace materializer::init::portable
