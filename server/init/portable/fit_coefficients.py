#!/usr/bin/env python3
"""Derives the polynomial coefficients of server/init/portable/exact_math.h.

Each function is approximated by a polynomial that interpolates it at the
Chebyshev nodes of its interval (near-minimax), computed in 60-digit
arithmetic with mpmath and rounded to the target format. The degree is the
smallest whose approximation error, with the rounded coefficients, is below
the target (2^-27 relative for float32, 2^-56 for float64): the evaluation
in float arithmetic then adds at most a few ulps of its own.

The constants in exact_math.h, docs/portable-rng.md and
tests/python/portable_ref.py are this script's output. It is a tool for
whoever changes the approximations; builds and tests do not run it
(the constants are part of the specification and must never change for an
existing rng definition).

  .venv/bin/python server/init/portable/fit_coefficients.py
"""

import struct
import sys

import mpmath as mp

mp.mp.dps = 50


def to_f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def hexf(x, fmt):
    if fmt == "f32":
        return float(to_f32(x)).hex()
    return float(x).hex()


def chebyshev_fit(g, lo, hi, degree):
    """Monomial coefficients c[0..degree] (in t) of the polynomial that
    interpolates g at the Chebyshev nodes of [lo, hi]. Solved in the
    normalized variable y = (t - mid) / half, then expanded in t."""
    n = degree + 1
    lo, hi = mp.mpf(lo), mp.mpf(hi)
    mid, half = (lo + hi) / 2, (hi - lo) / 2
    ys = [mp.cos(mp.pi * (2 * k + 1) / (2 * n)) for k in range(n)]
    values = [g(mid + half * y) for y in ys]
    a = mp.matrix([[y ** j for j in range(n)] for y in ys])
    b = mp.lu_solve(a, mp.matrix(values))
    # sum_j b_j ((t - mid) / half)^j, expanded.
    c = [mp.mpf(0)] * n
    for j in range(n):
        scale = b[j] / half ** j
        for k in range(j + 1):
            c[k] += scale * mp.binomial(j, k) * (-mid) ** (j - k)
    return c


def rounded(coeffs, fmt):
    if fmt == "f32":
        return [mp.mpf(to_f32(c)) for c in coeffs]
    return [mp.mpf(float(c)) for c in coeffs]


def horner(coeffs, t):
    p = mp.mpf(0)
    for c in reversed(coeffs):
        p = p * t + c
    return p


def max_error(g, coeffs, lo, hi, weight, samples):
    worst = mp.mpf(0)
    for k in range(samples + 1):
        t = mp.mpf(lo) + (mp.mpf(hi) - mp.mpf(lo)) * k / samples
        worst = max(worst, abs(horner(coeffs, t) - g(t)) * weight(t))
    return worst


def fit(name, g, lo, hi, fmt, target, weight=None, min_degree=1, max_degree=40):
    """Smallest-degree fit of g on [lo, hi] whose weighted error (default:
    relative error) is below target, with the coefficients rounded."""
    if weight is None:
        weight = lambda t: 1 / abs(g(t))
    for degree in range(min_degree, max_degree + 1):
        coeffs = rounded(chebyshev_fit(g, lo, hi, degree), fmt)
        if max_error(g, coeffs, lo, hi, weight, 150) < target:
            err = max_error(g, coeffs, lo, hi, weight, 3000)
            if err < target:
                return name, degree, coeffs, err
    raise SystemExit(f"{name}: no degree <= {max_degree} reaches {target}")


def functions(fmt):
    sq = mp.sqrt
    # log: ln(m) = 2s + s^3 P(s^2), s = (m-1)/(m+1), m in [sqrt(1/2), sqrt(2)].
    z_log = ((sq(2) - 1) / (sq(2) + 1)) ** 2 * mp.mpf("1.0005")

    def log_p(z):
        if z == 0:
            return mp.mpf(2) / 3
        s = sq(z)
        return (2 * mp.atanh(s) - 2 * s) / s ** 3

    def sinpi_s(z):
        if z == 0:
            return +mp.pi
        x = sq(z)
        return mp.sin(mp.pi * x) / x

    def cospi_c(z):
        return mp.cos(mp.pi * sq(z))

    def erfinv_over_x_of_w(w):
        if w == 0:
            return sq(mp.pi) / 2
        x = sq(-mp.expm1(-w))
        return mp.erfinv(x) / x

    out = []
    if fmt == "f32":
        t = mp.mpf(2) ** mp.mpf("-24.5")
        t_erfinv = mp.mpf(2) ** mp.mpf("-23.5")
        w_max = 24 * mp.log(2) * mp.mpf("1.001")  # |x| <= 1 - 2^-24
        out.append(fit("kLogP", log_p, 0, z_log, fmt, t, weight=lambda z: z / 8))
        out.append(fit("kSinPi", sinpi_s, 0, mp.mpf(1) / 16, fmt, t))
        out.append(fit("kCosPi", cospi_c, 0, mp.mpf(1) / 16, fmt, t))
        out.append(fit("kErfInvCentral",
                       lambda v: erfinv_over_x_of_w(v + mp.mpf("2.5")),
                       -mp.mpf("2.5"), mp.mpf("2.5"), fmt, t_erfinv, min_degree=6))
        out.append(fit("kErfInvTail", lambda v: erfinv_over_x_of_w((v + 3) ** 2),
                       sq(5) - 3, sq(w_max) - 3, fmt, t_erfinv, min_degree=6))
    else:
        t = mp.mpf(2) ** mp.mpf("-53.5")
        w_max = 53 * mp.log(2) * mp.mpf("1.001")  # |x| <= 1 - 2^-53
        out.append(fit("kLogP", log_p, 0, z_log, fmt, t, weight=lambda z: z / 8,
                       min_degree=4))
        out.append(fit("kSinPi", sinpi_s, 0, mp.mpf(1) / 16, fmt, t, min_degree=5))
        out.append(fit("kCosPi", cospi_c, 0, mp.mpf(1) / 16, fmt, t, min_degree=5))
        out.append(fit("kErfInvCentral",
                       lambda v: erfinv_over_x_of_w(v + mp.mpf("3.125")),
                       -mp.mpf("3.125"), mp.mpf("3.125"), fmt, t, min_degree=20))
        out.append(fit("kErfInvMid",
                       lambda v: erfinv_over_x_of_w((v + mp.mpf("3.25")) ** 2),
                       mp.mpf("-0.75"), mp.mpf("0.75"), fmt, t, min_degree=17))
        out.append(fit("kErfInvTail", lambda v: erfinv_over_x_of_w((v + 5) ** 2),
                       -1, sq(w_max) - 5, fmt, t, min_degree=15))
    return out


def constants(fmt):
    ln2 = mp.log(2)
    if fmt == "f32":
        hi = mp.mpf(to_f32(ln2))
        # 12 trailing zero bits in hi, so e * hi is exact for |e| < 2^12.
        hi = mp.mpf(int(ln2 * 2 ** 12)) / 2 ** 12
        lo = mp.mpf(to_f32(ln2 - hi))
    else:
        hi = mp.mpf(int(ln2 * 2 ** 32)) / 2 ** 32
        lo = mp.mpf(float(ln2 - hi))
    return [("kLn2Hi", hi), ("kLn2Lo", lo)]


def main():
    for fmt in ("f32", "f64"):
        print(f"// ---- {fmt}")
        for name, value in constants(fmt):
            print(f"{name} = {hexf(value, fmt)}")
        for name, degree, coeffs, err in functions(fmt):
            print(f"{name}: degree {degree}, max rel error {mp.nstr(err, 3)}"
                  f" (2^{mp.nstr(mp.log(err, 2), 4)})")
            print("  {" + ", ".join(hexf(c, fmt) for c in coeffs) + "}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
