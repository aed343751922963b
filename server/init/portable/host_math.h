#ifndef MATERIALIZER_SERVER_INIT_PORTABLE_HOST_MATH_H_
#define MATERIALIZER_SERVER_INIT_PORTABLE_HOST_MATH_H_

// exp and erf in double for the host-side parameter setup of trunc_normal
// (the CDF of its bounds), written with +, -, *, /, floor and ldexp only,
// all exact or correctly rounded in IEEE arithmetic (and in Python), so a
// reimplementation gets the same bits without depending on a libm.
// docs/portable-rng.md gives the same steps. Relative error about 1e-15
// (host_math_test compares with libm).

namespace materializer::init::portable {

// e^x for x <= 0 (x >= -745; below that the result underflows to 0).
double PortableExp(double x);

// erf(x) for any finite x (+-1 beyond |x| >= 6, where erfc < 2^-56).
double PortableErf(double x);

}  // namespace materializer::init::portable

#endif  // MATERIALIZER_SERVER_INIT_PORTABLE_HOST_MATH_H_
