"""cuda_library: a cc_library of .cu sources compiled by nvcc, if found.

nvcc is looked for when the build action runs, at $CUDA_HOME/bin/nvcc
(CUDA_HOME reaches actions only under --config=cuda, which passes it with
--action_env) and else at the conventional /usr/local/cuda/bin/nvcc. The
toolkit's lib64/libcudart_static.a is linked, so binaries need no CUDA
library path at run time (only the driver, to find a GPU).

Without nvcc the library is the host-compiled `stub_srcs` instead (they
should implement the same functions and report that CUDA is absent), and
<name>.ptx says so; under --config=cuda that is an error.

Caveat: whether nvcc exists is not an input Bazel can see. An output built
before nvcc was installed (or removed) stays cached until the sources or
flags change; `bazel build --config=cuda` always rebuilds under its own
configuration.
"""

DEFAULT_CUDA_ARCHS = [
    # (virtual arch, real arch); a real arch "" embeds PTX for the driver to
    # JIT on newer GPUs.
    ("compute_80", "sm_80"),  # A100
    ("compute_90", "sm_90"),  # H100, H200
    ("compute_90", "compute_90"),
]

def _shell_list(items):
    return " ".join(["'%s'" % i for i in items])

def cuda_library(
        name,
        srcs,
        hdrs = [],
        cu_deps = [],
        stub_srcs = [],
        deps = [],
        nvcc_flags = [],
        host_flags = [],
        ptx_arch = "compute_90",
        archs = DEFAULT_CUDA_ARCHS,
        visibility = None,
        testonly = False):
    """A cc_library `name` from CUDA sources.

    Args:
      name: the cc_library; also <name>.ptx (PTX of the first source for
        ptx_arch, for tests that inspect device code) and <name>.nvcc.txt
        (which nvcc built it, or "stub: ..." and why).
      srcs: .cu files.
      hdrs: public headers of the library (plain C++; no CUDA headers).
      cu_deps: every header the .cu files (and stubs) include from this
        repository, as files.
      stub_srcs: host C++ files built instead when nvcc is absent.
      deps: cc deps of the library.
      nvcc_flags: extra nvcc flags.
      host_flags: flags for nvcc's host compiler (-Xcompiler).
      ptx_arch: virtual arch of <name>.ptx.
      archs: (virtual, real) pairs for -gencode.
    """
    lib = "lib%s_kernels.a" % name
    cudart = "%s_cudart/libcudart_static.a" % name
    ptx = name + ".ptx"
    status = name + ".nvcc.txt"
    gencode = ["-gencode=arch=%s,code=%s" % (v, r) for v, r in archs]
    flags = ["-std=c++17", "-O3", "-I."] + nvcc_flags + gencode
    xcompiler = ["-fPIC"] + host_flags
    flags.append("-Xcompiler=" + ",".join(xcompiler))

    body = """
set -eu
CUDA_ROOT="$${CUDA_HOME:-/usr/local/cuda}"
NVCC="$$CUDA_ROOT/bin/nvcc"
TMP="$$(mktemp -d)"
trap 'rm -rf "$$TMP"' EXIT
if [ -x "$$NVCC" ]; then
  n=0
  for src in %s; do
    n=$$((n + 1))
    "$$NVCC" %s -c "$$src" -o "$$TMP/$$n.o"
  done
  "$$NVCC" %s -ptx -arch=%s %s -o $(location %s)
  ar rcs $(location %s) "$$TMP"/*.o
  CUDART="$$CUDA_ROOT/lib64/libcudart_static.a"
  [ -f "$$CUDART" ] || CUDART="$$CUDA_ROOT/targets/x86_64-linux/lib/libcudart_static.a"
  cp "$$CUDART" $(location %s)
  echo "nvcc: $$("$$NVCC" --version | tail -n 1) at $$NVCC" > $(location %s)
else
  if [ "$$REQUIRE_CUDA" = 1 ]; then
    echo "cuda_library %s: --config=cuda needs nvcc, and there is none at $$NVCC (set CUDA_HOME to the toolkit root)" >&2
    exit 1
  fi
  n=0
  for src in %s; do
    n=$$((n + 1))
    $(CC) -std=c++17 -O2 -fPIC -iquote . -c "$$src" -o "$$TMP/$$n.o"
  done
  ar rcs $(location %s) "$$TMP"/*.o
  ar rcs $(location %s)
  echo "// nvcc not found at $$NVCC: this build has no device code" > $(location %s)
  echo "stub: nvcc not found at $$NVCC" > $(location %s)
fi
""" % (
        " ".join(["$(location %s)" % s for s in srcs]),
        _shell_list(flags),
        _shell_list(["-std=c++17", "-O3", "-I."] + nvcc_flags),
        ptx_arch,
        "$(location %s)" % srcs[0],
        ptx,
        lib,
        cudart,
        status,
        name,
        " ".join(["$(location %s)" % s for s in stub_srcs]),
        lib,
        cudart,
        ptx,
        status,
    )

    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + cu_deps + stub_srcs,
        outs = [lib, cudart, ptx, status],
        cmd = select({
            "//third_party/cuda:cuda_required": "REQUIRE_CUDA=1\n" + body,
            "//conditions:default": "REQUIRE_CUDA=0\n" + body,
        }),
        toolchains = ["@bazel_tools//tools/cpp:current_cc_toolchain"],
        message = "nvcc (or its stub) %s" % name,
        testonly = testonly,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name + "_cudart",
        srcs = [cudart],
        linkopts = ["-ldl", "-lpthread", "-lrt"],
        testonly = testonly,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [lib],
        hdrs = hdrs,
        deps = deps + [":" + name + "_cudart"],
        testonly = testonly,
        visibility = visibility,
    )
