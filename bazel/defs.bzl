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

# Under --config=asan every test finds the LeakSanitizer suppressions in
# its runfiles (LSAN_OPTIONS in .bazelrc names them).
_ASAN_DATA = select({
    "//bazel:asan": ["//bazel/asan:asan.supp"],
    "//conditions:default": [],
})

# Our libraries are only ever linked statically into binaries and tests
# (--dynamic_mode=off). linkstatic = True says so to Bazel: without it
# `bazel build //...` also links each library into a .so nobody uses
# (and .bazelrc's --features=-supports_pic keeps it from compiling their
# sources twice).
def mat_cc_library(name, copts = [], visibility = None, **kwargs):
    native.cc_library(
        name = name,
        copts = MAT_COPTS + copts,
        visibility = visibility or ["//bazel:internal"],
        linkstatic = True,
        **kwargs
    )

def mat_cc_binary(name, copts = [], deps = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = MAT_COPTS + copts,
        deps = deps + _TSAN_DEPS,
        **kwargs
    )

def mat_cc_test(name, copts = [], deps = [], data = [], size = "small", **kwargs):
    """A GoogleTest binary; main() comes from gmock_main."""
    native.cc_test(
        name = name,
        copts = MAT_COPTS + copts,
        size = size,
        deps = deps + ["@system_gtest//:gtest_main"] + _TSAN_DEPS,
        data = data + _ASAN_DATA,
        **kwargs
    )

def mat_cc_fuzz_target(name, srcs, deps = [], copts = [], corpus_size = "medium", **kwargs):
    """A fuzz target (LLVMFuzzerTestOneInput in `srcs`) and its corpus test.

    Defines
      :<name>_lib          the target itself, as a library
      :<name>              under --config=asan (clang, ./dev fuzz): a libFuzzer
                           binary; otherwise a replay binary that runs the
                           inputs named on its command line (files or
                           folders), so a finding reproduces with g++ too
      :<name>_corpus_test  runs every committed input of corpus/<name>/ (the
                           seeds and the regression inputs) through the
                           target; part of `bazel test //...` and of
                           --config=asan
    """
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        copts = MAT_COPTS + copts,
        deps = deps,
        # Only main() refers to LLVMFuzzerTestOneInput.
        alwayslink = True,
        linkstatic = True,  # no unused .so (see mat_cc_library)
        **kwargs
    )
    native.cc_binary(
        name = name,
        testonly = True,
        deps = [":" + name + "_lib"] + select({
            "//bazel:asan": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }) + _TSAN_DEPS,
        linkopts = select({
            "//bazel:asan": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    corpus = native.package_name() + "/corpus/" + name
    native.cc_test(
        name = name + "_corpus_test",
        size = corpus_size,
        deps = [
            ":" + name + "_lib",
            "//fuzz:replay_main",
        ] + _TSAN_DEPS,
        data = native.glob(["corpus/%s/**" % name]) + _ASAN_DATA,
        args = [corpus],
    )
