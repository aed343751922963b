#!/usr/bin/env python3
"""Builds the carry folder for a GPU machine run (tools/gpu-run).

The GPU machine has the same torch wheel (2.11.0, CUDA 13.0) in its
Python, but no Bazel, no gRPC C++ and no network. The carry holds
everything else the run needs, built here:

  bundle/                  tools/bundle.py --without-libtorch --with-system-libs:
    bin/materializerd, bin/matctl
    bin/portable_cuda_check, bin/portable_cuda_bench, bin/fetch_discard,
    bin/gpu_export_read
    tests/<name>           the C++ tests tagged requires-gpu
    lib/system/            gRPC, protobuf, abseil, ... (glibc stays the host's)
    lib/torch              absent: tools/gpu-run links the machine's torch here
  proto/                   the generated Python messages and stubs
  python/google/           this venv's protobuf runtime, used only if the
                           machine's cannot load the generated messages
  MANIFEST.json            commit, torch, nvcc, sizes, what is where

Every binary searches $ORIGIN/../lib/torch/lib and $ORIGIN/../lib/system
(DT_RPATH, so it covers the system libraries' own dependencies), as the
bundle's server does. The carry and the repository's tracked files travel
together and must stay under 64 MiB; this checks it.

    tools/gpu_carry.py --bazel-bin BAZEL_BIN --out .build/gpu-carry \\
        [--gpu-tests //server/init/portable:portable_cuda_test ...] [--require-cuda]

`./dev gpu-carry` builds the targets under --config=cuda and calls this.
"""

import argparse
import datetime
import json
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import bundle  # noqa: E402  (ldd, patch_binary, GLIBC, DRIVER)

# What a GPU run needs besides the server and matctl (bazel-bin paths).
TOOLS = {
    "portable_cuda_check": "server/init/portable/portable_cuda_check",
    "portable_cuda_bench": "server/init/portable/portable_cuda_bench",
    "fetch_discard": "bench/fetch_discard",
    "gpu_export_read": "bench/gpu_export_read",
}
SERVER = "server/materializerd"
MATCTL = "client/matctl"
PROTO = "proto/materializer/v1"
KERNELS_INFO = "server/init/portable/portable_kernel_cuda.nvcc.txt"
SEARCH_PATH = "$ORIGIN/../lib/torch/lib:$ORIGIN/../lib/system"
TRANSFER_LIMIT = 64 << 20  # carry + tracked files, per run


class CarryError(Exception):
    pass


def requires_gpu_tests(repo):
    """Labels of the tests tagged requires-gpu, read from the BUILD files
    (for callers without Bazel; `./dev gpu-carry` asks bazel query)."""
    labels = []
    for build in sorted(repo.rglob("BUILD.bazel")):
        rel = build.parent.relative_to(repo)
        if rel.parts and (rel.parts[0].startswith("bazel-") or
                          rel.parts[0] in (".build", ".venv", "third_party")):
            continue
        text = build.read_text()
        for rule in re.finditer(r"^\w+\(\n(.*?)^\)", text, re.S | re.M):
            body = rule.group(1)
            name = re.search(r'^\s*name = "([^"]+)"', body, re.M)
            if name and re.search(r'tags = \[[^\]]*"requires-gpu"', body):
                labels.append(f"//{rel.as_posix()}:{name.group(1)}")
    return labels


def label_path(label):
    """//pkg/sub:name -> pkg/sub/name (its path under bazel-bin)."""
    m = re.fullmatch(r"//([^:]*):(.+)", label)
    if not m:
        raise CarryError(f"not a label: {label}")
    return f"{m.group(1)}/{m.group(2)}" if m.group(1) else m.group(2)


def add_binary(src, dst, system_dir):
    """Copies an ELF binary into the carry with the carry's search path, and
    any system library it needs that lib/system lacks."""
    for soname, resolved in bundle.ldd(src):
        if soname in bundle.GLIBC or soname in bundle.DRIVER:
            continue
        if resolved is None:
            raise CarryError(f"{src}: {soname} does not resolve")
        if "/torch/lib/" in resolved or "/nvidia/" in resolved:
            continue  # LibTorch and its CUDA libraries: the machine's own
        target = system_dir / soname
        if not target.exists():
            shutil.copy2(resolved, target)
    bundle.patch_binary(src, dst, SEARCH_PATH, transitive=True)


def copy_protobuf_runtime(out):
    """The venv's protobuf package (pure Python plus its upb extension, a
    stable-ABI module), without caches and test data."""
    import google.protobuf
    src = pathlib.Path(google.protobuf.__file__).parent
    ignore = shutil.ignore_patterns("__pycache__", "testdata", "*.pyc")
    shutil.copytree(src, out / "google" / "protobuf", ignore=ignore)
    upb = src.parent / "_upb"
    if upb.is_dir():
        shutil.copytree(upb, out / "google" / "_upb", ignore=ignore)
    return google.protobuf.__version__


def git(*args):
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def tracked_bytes():
    total = 0
    for name in git("ls-files", "-z").split("\0"):
        path = REPO / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def du(path):
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*")
               if f.is_file() and not f.is_symlink())


def build(args):
    bin_dir = pathlib.Path(args.bazel_bin)
    out = pathlib.Path(args.out).resolve()
    kernels = (bin_dir / KERNELS_INFO).read_text().strip() \
        if (bin_dir / KERNELS_INFO).exists() else "not recorded"
    if args.require_cuda and not kernels.startswith("nvcc:"):
        raise CarryError(
            f"the CUDA kernels were not compiled ({kernels}); build with "
            "--config=cuda where nvcc exists (./dev gpu-carry does)")
    missing = [p for p in [SERVER, MATCTL, *TOOLS.values()]
               if not (bin_dir / p).exists()]
    if missing:
        raise CarryError(f"not built under {bin_dir}: {', '.join(missing)}")

    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    bundle_dir = stage / "bundle"
    bundle_args = [
        "--server", str(bin_dir / SERVER), "--matctl", str(bin_dir / MATCTL),
        "--out", str(bundle_dir), "--without-libtorch", "--with-system-libs"]
    if (bin_dir / KERNELS_INFO).exists():
        bundle_args += ["--buildinfo", str(bin_dir / KERNELS_INFO)]
    rc = bundle.main(bundle_args)
    if rc != 0:
        raise CarryError("tools/bundle.py failed (its message is above)")
    system_dir = bundle_dir / "lib" / "system"
    for name, rel in TOOLS.items():
        add_binary(bin_dir / rel, bundle_dir / "bin" / name, system_dir)
    tests = {}
    for label in args.gpu_tests:
        src = bin_dir / label_path(label)
        if not src.exists():
            raise CarryError(f"{label}: no binary at {src} (build it first)")
        name = src.name
        add_binary(src, bundle_dir / "tests" / name, system_dir)
        tests[label] = f"bundle/tests/{name}"

    proto_out = stage / "proto" / "materializer" / "v1"
    proto_out.mkdir(parents=True)
    for name in ("materializer_pb2.py", "materializer_pb2_grpc.py"):
        src = bin_dir / PROTO / name
        if not src.exists():
            raise CarryError(f"{src} missing: bazel build //proto:materializer_py")
        shutil.copy2(src, proto_out / name)
    protobuf_version = copy_protobuf_runtime(stage / "python")

    info = json.loads((bundle_dir / "share" / "materializer" /
                       "BUILDINFO.json").read_text())
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    manifest = {
        "commit": git("rev-parse", "--short=12", "HEAD") +
                  (" (with uncommitted changes)" if dirty else ""),
        "built": datetime.datetime.now(datetime.timezone.utc)
                 .strftime("%Y-%m-%d %H:%M UTC"),
        "torch": info.get("torch"),
        "cuda_runtime_here": info.get("cuda_runtime"),
        "cuda_kernels": kernels,
        "cuda_kernels_compiled": kernels.startswith("nvcc:"),
        "server": "bundle/bin/materializerd",
        "matctl": "bundle/bin/matctl",
        "tools": {name: f"bundle/bin/{name}" for name in TOOLS},
        "requires_gpu_tests": tests,
        "proto": "proto",
        "python_fallback": {"path": "python", "protobuf": protobuf_version},
    }
    manifest["bytes"] = du(stage)
    (stage / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")

    tracked = tracked_bytes()
    total = manifest["bytes"] + tracked
    if total > TRANSFER_LIMIT:
        raise CarryError(
            f"carry {manifest['bytes'] / 2**20:.1f} MiB + tracked files "
            f"{tracked / 2**20:.1f} MiB = {total / 2**20:.1f} MiB, over the "
            f"{TRANSFER_LIMIT >> 20} MiB a run can take")
    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    print(f"{out}: {manifest['bytes'] / 2**20:.1f} MiB; with the tracked files "
          f"({tracked / 2**20:.1f} MiB) {total / 2**20:.1f} MiB of "
          f"{TRANSFER_LIMIT >> 20} MiB; CUDA kernels: {kernels}; "
          f"requires-gpu tests: {', '.join(tests) or 'none'}")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bazel-bin", required=True,
                    help="Bazel's output folder (bazel info bazel-bin)")
    ap.add_argument("--out", default=str(REPO / ".build" / "gpu-carry"))
    ap.add_argument("--gpu-tests", nargs="*", default=None,
                    help="labels of the C++ tests tagged requires-gpu "
                    "(default: read from the BUILD files)")
    ap.add_argument("--require-cuda", action="store_true",
                    help="fail unless nvcc compiled the CUDA kernels")
    args = ap.parse_args(argv)
    if args.gpu_tests is None:
        args.gpu_tests = requires_gpu_tests(REPO)
    try:
        build(args)
    except (CarryError, bundle.BundleError, OSError) as error:
        print(f"gpu-carry: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
