"""The project's cc_* macros: our warning flags in one place.

Warnings are errors for code in this repository. Generated protobuf code and
external headers (system libraries, LibTorch) come in as -isystem and are
not held to them.
"""

MAT_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",  # overridden virtuals and callbacks keep their names
]

# Under --config=tsan every executable links the annotations that make the
# system abseil's mutexes visible to ThreadSanitizer.
_TSAN_DEPS = select({
    "//bazel:tsan": ["//third_party/absl_tsan:sync_annotations"],
    "//conditions:default": [],
})

def mat_cc_library(name, copts = [], visibility = None, **kwargs):
    native.cc_library(
        name = name,
        copts = MAT_COPTS + copts,
        visibility = visibility or ["//bazel:internal"],
        **kwargs
    )

def mat_cc_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = MAT_COPTS + copts,
        deps = deps + _TSAN_DEPS,
        **kwargs
    )

def mat_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest binary; main() comes from gmock_main."""
    native.cc_test(
        name = name,
        copts = MAT_COPTS + copts,
        size = size,
        deps = deps + ["@system_gtest//:gtest_main"] + _TSAN_DEPS,
        **kwargs
    )
