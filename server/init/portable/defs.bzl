"""Build macros for the portable RNG: the project's macros plus the flags
its exactness depends on.

-ffp-contract=off: without it GCC fuses a*b+c into an fma wherever the
target has one (the default for C++, even with -std=c++17), which changes
bits between the scalar and the AVX paths and the NumPy reference. Every
translation unit that includes the header-only core (generate.h and what
it includes) must be built with it; use these macros for all of them.
"""

load("//bazel:defs.bzl", "mat_cc_binary", "mat_cc_library", "mat_cc_test")

PORTABLE_COPTS = ["-ffp-contract=off"]

def portable_cc_library(name, copts = [], **kwargs):
    mat_cc_library(name = name, copts = PORTABLE_COPTS + copts, **kwargs)

def portable_cc_binary(name, copts = [], **kwargs):
    mat_cc_binary(name = name, copts = PORTABLE_COPTS + copts, **kwargs)

def portable_cc_test(name, copts = [], **kwargs):
    mat_cc_test(name = name, copts = PORTABLE_COPTS + copts, **kwargs)
