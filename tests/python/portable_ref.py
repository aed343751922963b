"""Pure-NumPy reference implementation of the portable RNG.

An independent implementation of docs/portable-rng.md, written from the
document (not translated from the C++ kernels), with NumPy's uint32/uint64
integer arithmetic and IEEE float32/float64 arithmetic. The tests hold the
server's library to it bit for bit (test_portable_reference.py).

NumPy has no fused multiply-add and Python 3.11 has no math.fma, so fma is
emulated exactly:

- float32 (fma32): a*b of two float32 values is exact in float64 (48
  significant bits < 53). The sum p + c is then rounded to float64 *with
  round-to-odd* (round to nearest, and if that was inexact and landed on an
  even significand, step one ulp toward the exact sum, whose sign the
  exact TwoSum error gives). Rounding a round-to-odd result with at least
  two more bits of precision to the target (53 >= 24 + 2) equals rounding
  the exact value once (Boldo and Melquiond, "Emulation of FMA and
  correctly rounded sums: proved algorithms using rounding to odd", IEEE
  TC 2008). So fma32 is the correctly rounded a*b + c, as hardware gives.
- float64 (fma64): exact rational arithmetic with fractions.Fraction,
  rounded once by float(Fraction), which CPython computes as a correctly
  rounded integer division; signed zeros follow IEEE 754 explicitly.

Usage:
    values = fill(seed=1, name="w", dtype="bfloat16", dist="normal",
                  params=dict(mean=0.0, std=0.02), shape=(11, 8),
                  box=((3, 0), (3, 8)))  # -> numpy array of the box's bits
"""

import math
from fractions import Fraction

import numpy as np

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1

F32 = np.float32
U32 = np.uint32
U64 = np.uint64

# ---------------------------------------------------------------- key ------


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def tensor_key(seed: int, name: str):
    s = splitmix64((seed ^ splitmix64(fnv1a64(name.encode()))) & MASK64)
    return s & MASK32, s >> 32


# ------------------------------------------------------------- philox ------

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32-R on arrays of counters; returns four uint32 arrays."""
    x0, x1, x2, x3 = (np.asarray(c, dtype=U32) for c in (c0, c1, c2, c3))
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = x0.astype(U64) * U64(PHILOX_M0)
        p1 = x2.astype(U64) * U64(PHILOX_M1)
        hi0, lo0 = (p0 >> U64(32)).astype(U32), p0.astype(U32)
        hi1, lo1 = (p1 >> U64(32)).astype(U32), p1.astype(U32)
        x0, x1, x2, x3 = (hi1 ^ x1 ^ U32(k0), lo1, hi0 ^ x3 ^ U32(k1), lo0)
    return x0, x1, x2, x3


# --------------------------------------------------------- exact fma -------


def fma32(a, b, c):
    """Correctly rounded float32 a*b + c (see the module docstring)."""
    a, b, c = (np.asarray(v, dtype=F32) for v in (a, b, c))
    p = a.astype(np.float64) * b.astype(np.float64)  # exact
    c64 = c.astype(np.float64)
    s = p + c64
    # TwoSum: err = (p + c) - s exactly.
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    s = np.asarray(s)
    even = (s.view(U64) & U64(1)) == 0
    fix = (err != 0) & even
    toward = np.where(err > 0, np.inf, -np.inf)
    s_odd = np.where(fix, np.nextafter(s, toward), s)
    return s_odd.astype(F32)


def _fma64_scalar(a: float, b: float, c: float) -> float:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return float(exact)
    product = a * b  # its sign is the IEEE sign of the exact product
    if product == 0 and c == 0:
        negative = math.copysign(1.0, product) < 0 and math.copysign(1.0, c) < 0
        return -0.0 if negative else 0.0
    return 0.0  # x + (-x) rounds to +0


def fma64(a, b, c):
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                    for v in (a, b, c)))
    out = np.empty(a.shape, dtype=np.float64)
    for idx in np.ndindex(a.shape):
        out[idx] = _fma64_scalar(float(a[idx]), float(b[idx]), float(c[idx]))
    return out


def horner(fma, z, coeffs):
    """c0 + z (c1 + z (c2 + ...)): p = cn; p = fma(p, z, c(n-1)); ..."""
    p = np.full(np.shape(z), coeffs[-1], dtype=np.asarray(z).dtype)
    for c in reversed(coeffs[:-1]):
        p = fma(p, z, c)
    return p


# ------------------------------------------------- polynomial constants ----

def _f(hexes):
    return [float.fromhex(h) for h in hexes.split()]


LOG_P_F32 = _f("0x1.55555cp-1 0x1.997c28p-2 0x1.2ee76cp-2")
SIN_PI_F32 = _f("0x1.921fb6p+1 -0x1.4abbbap+2 0x1.465ec4p+1 -0x1.2d9b40p-1")
COS_PI_F32 = _f("0x1.0p+0 -0x1.3bd3ccp+2 0x1.03c1dcp+2 -0x1.55c57ap+0 "
                "0x1.d9c2e8p-3")
ERFINV_CENTRAL_F32 = _f(
    "0x1.805c5ep+0 0x1.f91e8ap-3 -0x1.11c506p-8 -0x1.48650cp-10 "
    "0x1.c9e970p-13 -0x1.4db186p-18 -0x1.d0eda0p-19 0x1.f6a6f8p-22 "
    "0x1.90e8acp-26 -0x1.32e60ep-27")
ERFINV_TAIL_F32 = _f(
    "0x1.6a9efcp+1 0x1.006dc4p+0 0x1.357ffep-7 -0x1.f47f0ap-8 "
    "0x1.74bdc6p-8 -0x1.d7ab7ap-9 0x1.850108p-10 -0x1.ced4fcp-15 "
    "-0x1.43eae8p-12 0x1.e21b7ep-14")
LN2_HI_F32, LN2_LO_F32 = _f("0x1.62ep-1 0x1.0bfbe8p-15")
SQRT2_F32 = float.fromhex("0x1.6a09e6p+0")

LOG_P_F64 = _f("0x1.5555555555558p-1 0x1.99999999952abp-2 0x1.2492492df7663p-2 "
               "0x1.c71c62ddb431bp-3 0x1.7462b6e311a89p-3 0x1.39fe16ad885a7p-3 "
               "0x1.2b5bd9a316a24p-3")
SIN_PI_F64 = _f("0x1.921fb54442d18p+1 -0x1.4abbce625be41p+2 0x1.466bc677587f8p+1 "
                "-0x1.32d2cce2e5b19p-1 0x1.50782fda12d96p-4 -0x1.e30071afc3e59p-8 "
                "0x1.e3f38399551bfp-12")
COS_PI_F64 = _f("0x1.0p+0 -0x1.3bd3cc9be45dep+2 0x1.03c1f081b5aacp+2 "
                "-0x1.55d3c7e3c90f8p+0 0x1.e1f5068355e15p-3 -0x1.a6d1ec7906c20p-6 "
                "0x1.f9cc41140bb60p-10 -0x1.b264ba152378ap-14")
ERFINV_CENTRAL_F64 = _f(
    "0x1.a755e7c99ae86p+0 0x1.ebd80d9b13df9p-3 -0x1.8b6c33114eeaep-8 "
    "-0x1.84576948353e1p-11 0x1.879c2a20da432p-13 -0x1.d1d1f7ca4030fp-17 "
    "-0x1.6e8a53f106129p-20 0x1.c6b4f890935ddp-22 -0x1.f36ce4ae847fdp-26 "
    "-0x1.1a9eb1bc8f0f0p-28 0x1.20f4e6bf074cfp-30 -0x1.dc3ee8b6c53ccp-35 "
    "-0x1.c89564c5d1004p-37 0x1.723527b7cff86p-39 -0x1.6d9ec5e3ec6afp-44 "
    "-0x1.686642b67610ap-45 0x1.db523eb040288p-48 -0x1.73898c37dc54ap-55 "
    "-0x1.2c266176e7096p-53 0x1.1f4ba5de5dc3fp-56 0x1.536d397f9b9b1p-60 "
    "-0x1.9d290dd3bcb70p-62 -0x1.5087a244b0f6cp-70 0x1.e9b8ae7230c25p-69")
ERFINV_MID_F64 = _f(
    "0x1.8abcc380d5a48p+1 0x1.0158a6d641d55p+0 0x1.5ffcfe5b6cd38p-8 "
    "-0x1.ebadabba02be5p-9 0x1.468eeca944c44p-9 -0x1.ba9240d8768c3p-10 "
    "0x1.f3cc545d9ca81p-11 -0x1.7448bcc8e9aa7p-12 0x1.932e8fd4360edp-16 "
    "0x1.1e6abbe66ca02p-14 -0x1.8cf463501e9a0p-15 0x1.a241c6f237f34p-17 "
    "0x1.899aa0e374402p-19 -0x1.0b79e820e8497p-18 0x1.8db69feb41fb6p-20 "
    "-0x1.da75906425fdap-26 -0x1.079a074d69940p-22 0x1.1a9484c4d3628p-23 "
    "-0x1.674f1725daa65p-26 -0x1.06f1da245bfd3p-26 0x1.07e3c2020286fp-27")
ERFINV_TAIL_F64 = _f(
    "0x1.3664ddd1ad7fbp+2 0x1.02a30d1fba10ep+0 -0x1.22ea5df1a91f3p-13 "
    "-0x1.c2f36aa279aebp-13 0x1.3ebf4ef3b5615p-14 -0x1.4a348fad7e348p-16 "
    "0x1.2fbd02589bd26p-18 -0x1.0a907bf4485ffp-20 0x1.ebdffa9e50541p-23 "
    "-0x1.22257dfd46e27p-24 0x1.f2d284f48daf0p-26 -0x1.061ede388d27fp-26 "
    "0x1.0bc47e6a8d42bp-27 -0x1.dcbc784e3ddd5p-29 0x1.7179c8523efdcp-30 "
    "-0x1.e2ca102bd8fedp-32 0x1.dfa104bdba6ccp-35 0x1.7c4c87ec06926p-35 "
    "-0x1.2be218c378d5ep-36")
LN2_HI_F64, LN2_LO_F64 = _f("0x1.62e42fee00000p-1 0x1.a39ef35793c76p-33")
SQRT2_F64 = float.fromhex("0x1.6a09e667f3bcdp+0")

# ------------------------------------------------------ float32 math -------


def _to_float32(u):
    """uint32 words read as int32, converted (exact below 2^24)."""
    return np.asarray(u, dtype=U32).view(np.int32).astype(F32)


def log_f32(x):
    x = np.asarray(x, dtype=F32)
    bits = x.view(U32)
    m = ((bits & U32(0x007FFFFF)) | U32(0x3F800000)).view(F32)
    big = m > F32(SQRT2_F32)
    m = np.where(big, m * F32(0.5), m)
    e = _to_float32((bits >> U32(23)) - np.where(big, U32(126), U32(127)))
    f = m - F32(1)
    s = f / (f + F32(2))
    z = s * s
    p = horner(fma32, z, LOG_P_F32)
    ln_m = fma32(s * z, p, s + s)
    return fma32(e, F32(LN2_HI_F32), fma32(e, F32(LN2_LO_F32), ln_m))


def sincospi_f32(x):
    z = x * x
    return x * horner(fma32, z, SIN_PI_F32), horner(fma32, z, COS_PI_F32)


def erfinv_f32(x):
    x = np.asarray(x, dtype=F32)
    t = (F32(1) - x) * (F32(1) + x)
    t = np.where(t > F32(2.0 ** -24), t, F32(2.0 ** -24))
    w = -log_f32(t)
    central = horner(fma32, w - F32(2.5), ERFINV_CENTRAL_F32)
    with np.errstate(invalid="ignore"):
        tail = horner(fma32, np.sqrt(w) - F32(3), ERFINV_TAIL_F32)
    return np.where(w < F32(5), central, tail) * x


# ------------------------------------------------------ float64 math -------


def _to_float64(u):
    return np.asarray(u, dtype=U64).view(np.int64).astype(np.float64)


def log_f64(x):
    x = np.asarray(x, dtype=np.float64)
    bits = x.view(U64)
    m = ((bits & U64(0x000FFFFFFFFFFFFF)) | U64(0x3FF0000000000000)).view(np.float64)
    big = m > SQRT2_F64
    m = np.where(big, m * 0.5, m)
    e = _to_float64((bits >> U64(52)) - np.where(big, U64(1022), U64(1023)))
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    p = horner(fma64, z, LOG_P_F64)
    ln_m = fma64(s * z, p, s + s)
    return fma64(e, LN2_HI_F64, fma64(e, LN2_LO_F64, ln_m))


def sincospi_f64(x):
    z = x * x
    return x * horner(fma64, z, SIN_PI_F64), horner(fma64, z, COS_PI_F64)


def erfinv_f64(x):
    x = np.asarray(x, dtype=np.float64)
    t = (1.0 - x) * (1.0 + x)
    t = np.where(t > 2.0 ** -53, t, 2.0 ** -53)
    w = -log_f64(t)
    out = np.empty_like(w)
    central, mid = w < 6.25, (w >= 6.25) & (w < 16.0)
    tail = w >= 16.0
    out[central] = horner(fma64, w[central] - 3.125, ERFINV_CENTRAL_F64)
    out[mid] = horner(fma64, np.sqrt(w[mid]) - 3.25, ERFINV_MID_F64)
    out[tail] = horner(fma64, np.sqrt(w[tail]) - 5.0, ERFINV_TAIL_F64)
    return out * x


# ------------------------------------------- host-side parameter setup -----

INV_LN2 = float.fromhex("0x1.71547652b82fep+0")
EXP_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
EXP_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
TWO_OVER_SQRT_PI = float.fromhex("0x1.20dd750429b6dp+0")
INV_SQRT2 = float.fromhex("0x1.6a09e667f3bcdp-1")


def portable_exp(x: float) -> float:
    if x < -745.0:
        return 0.0
    k = math.floor(x * INV_LN2 + 0.5)
    r = (x - k * EXP_LN2_HI) - k * EXP_LN2_LO
    inv_fact = []
    factorial = 1.0
    for j in range(14):
        if j > 0:
            factorial *= j
        inv_fact.append(1.0 / factorial)
    p = inv_fact[13]
    for j in range(12, -1, -1):
        p = p * r + inv_fact[j]
    return math.ldexp(p, k)


def portable_erf(x: float) -> float:
    a = abs(x)
    if a >= 6.0:
        return math.copysign(1.0, x)
    a2 = a * a
    term = a
    total = a
    for n in range(1, 140):
        term = term * (a2 + a2) / (2 * n + 1)
        total = total + term
    r = total * TWO_OVER_SQRT_PI * portable_exp(-a2)
    if r > 1.0:
        r = 1.0
    return math.copysign(r, x)


def dist_params(dist: str, params: dict) -> dict:
    """(scale, shift, lo, width, clamp_lo, clamp_hi) in float64."""
    p = dict(scale=0.0, shift=0.0, lo=0.0, width=0.0, clamp_lo=0.0,
             clamp_hi=0.0)
    if dist == "constant":
        p["shift"] = params["value"]
    elif dist == "uniform":
        p["scale"] = params["b"] - params["a"]
        p["shift"] = params["a"]
    elif dist == "normal":
        p["scale"], p["shift"] = params["std"], params["mean"]
    elif dist == "trunc_normal":
        mean, std, a, b = (params[k] for k in ("mean", "std", "a", "b"))
        alpha = (a - mean) / std
        beta = (b - mean) / std
        p["lo"] = portable_erf(alpha * INV_SQRT2)
        p["width"] = portable_erf(beta * INV_SQRT2) - p["lo"]
        p["scale"] = std * SQRT2_F64
        p["shift"] = mean
        p["clamp_lo"], p["clamp_hi"] = a, b
    else:
        raise ValueError(dist)
    return p


# -------------------------------------------------- values, float32 -------


def _box_mueller_f32(wa, wb):
    u1 = _to_float32((wa >> U32(8)) + U32(1)) * F32(2.0 ** -24)
    r = np.sqrt(log_f32(u1) * F32(-2))
    m = wb >> U32(8)
    q = (m + U32(0x200000)) >> U32(22)
    x = _to_float32(m - (q << U32(22))) * F32(2.0 ** -23)
    s, c = sincospi_f32(x)
    odd = (q & U32(1)) == 1
    cos_abs = np.where(odd, s, c).astype(F32)
    sin_abs = np.where(odd, c, s).astype(F32)
    cos_v = (cos_abs.view(U32) ^ (((q + U32(1)) & U32(2)) << U32(30))).view(F32)
    sin_v = (sin_abs.view(U32) ^ ((q & U32(2)) << U32(30))).view(F32)
    return r * cos_v, r * sin_v


def values_f32(words, j, dist, p):
    """Compute-type values of the elements that are word j of their block."""
    w = [np.asarray(x, dtype=U32) for x in words]
    scale, shift = F32(p["scale"]), F32(p["shift"])
    n = len(j)
    if dist == "constant":
        return np.full(n, shift, dtype=F32)
    if dist == "uniform":
        wj = np.choose(j, w)
        u = _to_float32(wj >> U32(8)) * F32(2.0 ** -24)
        return fma32(u, scale, shift)
    if dist == "normal":
        z0, z1 = _box_mueller_f32(w[0], w[1])
        z2, z3 = _box_mueller_f32(w[2], w[3])
        return fma32(np.choose(j, [z0, z1, z2, z3]), scale, shift)
    if dist == "trunc_normal":
        wj = np.choose(j, w)
        u = _to_float32(((wj >> U32(9)) << U32(1)) | U32(1)) * F32(2.0 ** -24)
        y = fma32(u, F32(p["width"]), F32(p["lo"]))
        x = fma32(erfinv_f32(y), scale, shift)
        lo, hi = F32(p["clamp_lo"]), F32(p["clamp_hi"])
        x = np.where(x > lo, x, lo)
        return np.where(x < hi, x, hi).astype(F32)
    raise ValueError(dist)


# -------------------------------------------------- values, float64 -------


def _bits53(hi, lo):
    return (np.asarray(hi, U32).astype(U64) << U64(21)) | \
        (np.asarray(lo, U32).astype(U64) >> U64(11))


def values_f64(words, j, dist, p):
    m0 = _bits53(words[0], words[1])
    m1 = _bits53(words[2], words[3])
    mj = np.where(j == 0, m0, m1)
    n = len(j)
    scale, shift = p["scale"], p["shift"]
    if dist == "constant":
        return np.full(n, shift, dtype=np.float64)
    if dist == "uniform":
        return fma64(_to_float64(mj) * 2.0 ** -53, scale, shift)
    if dist == "normal":
        u1 = _to_float64(m0 + U64(1)) * 2.0 ** -53
        r = np.sqrt(log_f64(u1) * -2.0)
        q = (m1 + U64(1 << 50)) >> U64(51)
        x = _to_float64(m1 - (q << U64(51))) * 2.0 ** -52
        s, c = sincospi_f64(x)
        odd = (q & U64(1)) == 1
        cos_abs = np.where(odd, s, c)
        sin_abs = np.where(odd, c, s)
        cos_v = (cos_abs.view(U64) ^ (((q + U64(1)) & U64(2)) << U64(62))).view(np.float64)
        sin_v = (sin_abs.view(U64) ^ ((q & U64(2)) << U64(62))).view(np.float64)
        z = np.where(j == 0, r * cos_v, r * sin_v)
        return fma64(z, scale, shift)
    if dist == "trunc_normal":
        u = _to_float64(((mj >> U64(1)) << U64(1)) | U64(1)) * 2.0 ** -53
        y = fma64(u, p["width"], p["lo"])
        x = fma64(erfinv_f64(y), scale, shift)
        x = np.where(x > p["clamp_lo"], x, p["clamp_lo"])
        return np.where(x < p["clamp_hi"], x, p["clamp_hi"])
    raise ValueError(dist)


# ------------------------------------------------------ narrow formats ----

# (bits, mantissa bits, bias, overflow threshold (float32 bits of |x|),
#  overflow result, NaN result)
NARROW = {
    "bfloat16": (16, 7, 127, 0x7F800000, 0x7F80, 0x7FC0),
    "float16": (16, 10, 15, 0x47800000, 0x7C00, 0x7E00),
    "float8_e4m3fn": (8, 3, 7, 0x43F00000, 0x7F, 0x7F),
    "float8_e5m2": (8, 2, 15, 0x47800000, 0x7C, 0x7F),
}


def round_to_narrow(x, dtype):
    """float32 -> narrow bits, round to nearest even (torch's overflow)."""
    nbits, mant, bias, overflow_from, overflow_bits, nan_bits = NARROW[dtype]
    shift = 23 - mant
    bits = np.asarray(x, dtype=F32).view(U32)
    sign = bits & U32(0x80000000)
    mag = bits ^ sign
    odd = (mag >> U32(shift)) & U32(1)
    rebias = ((bias - 127) << 23) & MASK32
    normal = (mag + U32((rebias + (1 << (shift - 1)) - 1) & MASK32) + odd) >> U32(shift)
    magic = ((127 - bias) + shift + 1) << 23
    sub = (mag.view(F32) + np.asarray(U32(magic)).view(F32)).view(U32) - U32(magic)
    out = np.where(mag < U32((127 - bias + 1) << 23), sub, normal)
    out = np.where(mag < U32(overflow_from), out,
                   np.where(mag > U32(0x7F800000), U32(nan_bits), U32(overflow_bits)))
    out = out | (sign >> U32(32 - nbits))
    return out.astype(np.uint16 if nbits == 16 else np.uint8)


# --------------------------------------------------------------- fill -----

ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2,
            "float8_e4m3fn": 1, "float8_e5m2": 1}


def box_indices(shape, box=None):
    """Full-tensor linear indices of the box's elements, box row-major."""
    shape = tuple(int(s) for s in shape)
    if box is None:
        box = ((0,) * len(shape), shape)
    offset, length = box
    if len(shape) == 0:
        return np.zeros(1, dtype=np.int64)
    grids = np.meshgrid(*[np.arange(o, o + n, dtype=np.int64)
                          for o, n in zip(offset, length)], indexing="ij")
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    index = np.zeros(grids[0].shape, dtype=np.int64)
    for g, s in zip(grids, strides):
        index += g * s
    return index.reshape(-1)


def chunk_box(shape, shards):
    """torch.chunk split: shards is [(dim, index, count), ...]."""
    offset, length = [0] * len(shape), list(shape)
    for dim, index, count in shards:
        size = shape[dim]
        chunk = -(-size // count)
        begin = min(size, chunk * index)
        end = min(size, begin + chunk)
        offset[dim], length[dim] = begin, end - begin
    return tuple(offset), tuple(length)


def fill(seed, name, dtype, dist, params, shape, box=None, stream=0):
    """The box's elements, as the array of stored bits (float32/float64
    values, or uint16/uint8 narrow bits), box row-major, flat."""
    k0, k1 = tensor_key(seed, name)
    p = dist_params(dist, params)
    i = box_indices(shape, box).astype(U64)
    if dtype == "float64":
        block = ((i >> U64(5)) << U64(4)) | (i & U64(15))
        j = ((i >> U64(4)) & U64(1)).astype(np.int64)
    else:
        block = ((i >> U64(6)) << U64(4)) | (i & U64(15))
        j = ((i >> U64(4)) & U64(3)).astype(np.int64)
    words = philox4x32(block.astype(U32), (block >> U64(32)).astype(U32),
                       np.full(block.shape, stream, dtype=U32),
                       np.zeros(block.shape, dtype=U32), k0, k1)
    if dtype == "float64":
        return values_f64(words, j, dist, p)
    for key in ("scale", "shift", "lo", "width", "clamp_lo", "clamp_hi"):
        with np.errstate(over="ignore"):
            if not np.isfinite(F32(p[key])):
                raise ValueError(f"{key} overflows float32")
    values = values_f32(words, j, dist, p)
    if dtype == "float32":
        return values
    return round_to_narrow(values, dtype)


# ------------------------------------------------------------ init steps --

BITS_DTYPE = {"float32": np.float32, "float64": np.float64,
              "bfloat16": np.uint16, "float16": np.uint16,
              "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def fill_steps(seed, name, dtype, shape, steps, box=None):
    """A tensor's stored bits after its init steps (docs/portable-rng.md,
    "Init steps"), for the whole tensor or `box`, box row-major, flat.

    `steps` are dicts, in order: {"dist": ..., "params": ...} for a
    distribution of `fill` (constant, uniform, normal, trunc_normal), or
    {"bits": array} for literal values (the region's stored bits,
    row-major); each may have "region": (offset, length), the box of the
    full tensor it fills (none: the whole tensor). Step k fills its region
    as a tensor of its own shape, from stream k of the tensor's key; the
    part of it that `box` holds is written, later steps over earlier ones.
    """
    shape = tuple(int(s) for s in shape)
    whole = ((0,) * len(shape), shape)
    offset, length = box if box is not None else whole
    out = np.zeros(tuple(length), dtype=BITS_DTYPE[dtype])
    for k, step in enumerate(steps):
        r_offset, r_length = step.get("region") or whole
        lo = [max(b, r) for b, r in zip(offset, r_offset)]
        hi = [min(b + bl, r + rl) for b, bl, r, rl
              in zip(offset, length, r_offset, r_length)]
        if any(h <= l for l, h in zip(lo, hi)):
            continue  # this box holds none of the step's region
        part_len = tuple(h - l for l, h in zip(lo, hi))
        in_region = (tuple(l - r for l, r in zip(lo, r_offset)), part_len)
        if "bits" in step:
            bits = np.asarray(step["bits"]).reshape(tuple(r_length))
            part = bits[tuple(slice(o, o + n) for o, n in zip(*in_region))]
        else:
            part = fill(seed, name, dtype, step["dist"], step["params"],
                        r_length, in_region, stream=k).reshape(part_len)
        out[tuple(slice(l - b, h - b)
                  for l, h, b in zip(lo, hi, offset))] = part
    return out.reshape(-1)


# ------------------------------------------------ elementwise programs ----
# docs/portable-rng.md, section 14: InitStep.map in float64.

EXP_TAYLOR = [float.fromhex(h) for h in (
    "0x1.0000000000000p+0", "0x1.0000000000000p+0", "0x1.0000000000000p-1",
    "0x1.5555555555555p-3", "0x1.5555555555555p-5", "0x1.1111111111111p-7",
    "0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-13", "0x1.a01a01a01a01ap-16",
    "0x1.71de3a556c734p-19", "0x1.27e4fb7789f5cp-22", "0x1.ae64567f544e4p-26",
    "0x1.1eed8eff8d898p-29", "0x1.6124613a86d09p-33", "0x1.93974a8c07c9dp-37")]


def _pow2(k):
    return float(np.uint64((k + 1023) << 52).view(np.float64))


def exp_f64(x):
    x = float(x)
    if x <= -746.0:
        return 0.0
    if x >= 710.0:
        return math.inf
    shifter = float.fromhex("0x1.8p52")
    t = _fma64_scalar(x, float.fromhex("0x1.71547652b82fep+0"), shifter)
    k = t - shifter
    r = _fma64_scalar(-k, LN2_HI_F64, x)
    r = _fma64_scalar(-k, LN2_LO_F64, r)
    p = EXP_TAYLOR[13]
    for c in reversed(EXP_TAYLOR[:13]):
        p = _fma64_scalar(p, r, c)
    ki = int(k)
    k1 = ki // 2
    k2 = ki - k1
    return (p * _pow2(k1)) * _pow2(k2)


def expm1_f64(x):
    x = float(x)
    half_ln2 = float.fromhex("0x1.62e42fefa39efp-2")
    if x > half_ln2 or x < -half_ln2:
        return exp_f64(x) - 1.0
    p = EXP_TAYLOR[14]
    for c in reversed(EXP_TAYLOR[1:14]):
        p = _fma64_scalar(p, x, c)
    return x * p


def log_any_f64(x):
    x = float(x)
    if x < float.fromhex("0x1p-1022"):
        return float(log_f64(np.float64(x * 2.0 ** 54))) - float.fromhex("0x1.2b708872320e2p+5")
    return float(log_f64(np.float64(x)))


def log1p_f64(x):
    x = float(x)
    u = 1.0 + x
    if u == 1.0:
        return x
    return log_any_f64(u) * (x / (u - 1.0))


def softplus_f64(x):
    return x if x > 20.0 else log1p_f64(exp_f64(x))


def pow_f64(x, c):
    if c == 0.0:
        return 1.0
    if c == 1.0:
        return x
    if c == 2.0:
        return x * x
    if c == 3.0:
        return (x * x) * x
    if c == 0.5:
        return math.sqrt(x)
    if c == -1.0:
        return 1.0 / x
    if x == 0.0:
        return 0.0
    if x > 0.0:
        return exp_f64(c * log_any_f64(x))
    magnitude = exp_f64(c * log_any_f64(-x))
    return magnitude if (c / 2) == math.floor(c / 2) else -magnitude


# float32 programs (every map.dtype but float64): the same functions in
# float32 arithmetic, every fma correctly rounded (fma32).

EXP_TAYLOR_F32 = [F32(float.fromhex(h)) for h in (
    "0x1.0p+0", "0x1.0p+0", "0x1.0p-1", "0x1.555556p-3", "0x1.555556p-5",
    "0x1.111112p-7", "0x1.6c16c2p-10", "0x1.a01a02p-13")]


def _f32(v):
    return np.asarray(v, dtype=F32).reshape(())


def exp_f32(x):
    x = _f32(x)
    if x <= F32(-104.0):
        return F32(0.0)
    if x >= F32(89.0):
        return F32(np.inf)
    shifter = F32(float.fromhex("0x1.8p23"))
    t = fma32(x, F32(float.fromhex("0x1.715476p+0")), shifter)
    k = t - shifter
    r = fma32(-k, F32(float.fromhex("0x1.62ep-1")), x)
    r = fma32(-k, F32(float.fromhex("0x1.0bfbe8p-15")), r)
    p = EXP_TAYLOR_F32[7]
    for c in reversed(EXP_TAYLOR_F32[:7]):
        p = fma32(p, r, c)
    ki = int(k)
    k1 = ki // 2
    k2 = ki - k1
    return (F32(p) * F32(2.0 ** k1)) * F32(2.0 ** k2)


def expm1_f32(x):
    x = _f32(x)
    half_ln2 = F32(float.fromhex("0x1.62e430p-2"))
    if x > half_ln2 or x < -half_ln2:
        return F32(exp_f32(x) - F32(1.0))
    p = EXP_TAYLOR_F32[7]
    for c in reversed(EXP_TAYLOR_F32[1:7]):
        p = fma32(p, x, c)
    return F32(x * F32(p))


def log_any_f32(x):
    x = _f32(x)
    if x < F32(float.fromhex("0x1p-126")):
        return F32(F32(log_f32(x * F32(2.0 ** 23))) - F32(float.fromhex("0x1.fe2804p+3")))
    return F32(log_f32(x))


def log1p_f32(x):
    x = _f32(x)
    u = F32(F32(1.0) + x)
    if u == F32(1.0):
        return F32(x)
    return F32(log_any_f32(u) * F32(x / F32(u - F32(1.0))))


def softplus_f32(x):
    x = _f32(x)
    return F32(x) if x > F32(20.0) else log1p_f32(exp_f32(x))


def pow_f32(x, c):
    x, c = _f32(x), F32(c)
    if c == 0.0:
        return F32(1.0)
    if c == 1.0:
        return F32(x)
    if c == 2.0:
        return F32(x * x)
    if c == 3.0:
        return F32(F32(x * x) * x)
    if c == 0.5:
        return F32(np.sqrt(x))
    if c == -1.0:
        return F32(F32(1.0) / x)
    if x == 0.0:
        return F32(0.0)
    if x > 0.0:
        return exp_f32(F32(c * log_any_f32(x)))
    magnitude = exp_f32(F32(c * log_any_f32(-x)))
    even = abs(float(c)) >= 2.0 ** 24 or int(c) % 2 == 0
    return magnitude if even else F32(-magnitude)


F32_FUNCTIONS = {"EXP": exp_f32, "LOG": log_any_f32, "EXPM1": expm1_f32,
                 "LOG1P": log1p_f32, "SOFTPLUS": softplus_f32}


def elementwise_op_f32(op, x, y):
    """elementwise_op in float32: x, y float32 scalars (y None for the
    constant, which is rounded to float32, as clamp bounds are)."""
    kind = op["kind"]
    x = F32(x)
    other = F32(y) if y is not None else F32(op.get("c", 0.0))
    first = op.get("constantFirst", False) and y is None
    with np.errstate(all="ignore"):
        if kind == "ADD":
            return F32(x + other)
        if kind == "SUB":
            return F32(other - x) if first else F32(x - other)
        if kind == "MUL":
            return F32(x * other)
        if kind == "DIV":
            return F32(other / x) if first else F32(x / other)
        if kind == "POW":
            return pow_f32(x, op.get("c", 0.0))
        if kind == "NEG":
            return F32(-x)
        if kind in F32_FUNCTIONS:
            return F32(F32_FUNCTIONS[kind](x))
        if kind == "SQRT":
            return F32(np.sqrt(x))
        if kind == "RECIPROCAL":
            return F32(F32(1.0) / x)
        if kind == "CLAMP":
            v = x
            if "min" in op and v < F32(op["min"]):
                v = F32(op["min"])
            if "max" in op and v > F32(op["max"]):
                v = F32(op["max"])
            return v
    raise ValueError(kind)


def elementwise_op(op, x, y):
    """One op of a program on one element (op: the JSON mapping of an
    ElementwiseOp, with 'y' an operand value or None for the constant)."""
    kind = op["kind"]
    c = op.get("c", 0.0)
    other = y if y is not None else c
    first = op.get("constantFirst", False) and y is None
    if kind == "ADD":
        return x + other
    if kind == "SUB":
        return other - x if first else x - other
    if kind == "MUL":
        return x * other
    if kind == "DIV":
        return other / x if first else x / other
    if kind == "POW":
        return pow_f64(x, c)
    if kind == "NEG":
        return -x
    if kind == "EXP":
        return exp_f64(x)
    if kind == "LOG":
        return log_any_f64(x)
    if kind == "EXPM1":
        return expm1_f64(x)
    if kind == "LOG1P":
        return log1p_f64(x)
    if kind == "SQRT":
        return math.sqrt(x)
    if kind == "RECIPROCAL":
        return 1.0 / x
    if kind == "CLAMP":
        v = x
        if "min" in op and v < op["min"]:
            v = op["min"]
        if "max" in op and v > op["max"]:
            v = op["max"]
        return v
    if kind == "SOFTPLUS":
        return softplus_f64(x)
    raise ValueError(kind)


def run_program(ops, leaf, compute="float32"):
    """The program's last value for each element of `leaf`, computed in
    `compute` (the program's map.dtype: float64, or float32 for every
    other); float64 or float32 out."""
    if compute == "float64":
        out = np.empty(len(leaf), dtype=np.float64)
        for i, v0 in enumerate(np.asarray(leaf, dtype=np.float64)):
            values = [float(v0)]
            for op in ops:
                y = values[op["y"]] if "y" in op else None
                values.append(elementwise_op(op, values[op.get("x", 0)], y))
            out[i] = values[-1]
        return out
    out = np.empty(len(leaf), dtype=F32)
    for i, v0 in enumerate(np.asarray(leaf, dtype=F32)):
        values = [F32(v0)]
        for op in ops:
            y = values[op["y"]] if "y" in op else None
            values.append(elementwise_op_f32(op, values[op.get("x", 0)], y))
        out[i] = values[-1]
    return out
