#!/usr/bin/env python3
"""Builds a relocatable runtime bundle of materializerd and matctl.

The binaries Bazel links find LibTorch through an absolute RUNPATH into the
build's venv, so they cannot be copied elsewhere as they are. A bundle is a
folder that runs from any path (`./dev package` builds one; the container
image installs one):

  bin/materializerd, bin/matctl     RUNPATH $ORIGIN/../lib/torch/lib
  lib/torch/lib/*.so                LibTorch (from the torch wheel)
  lib/nvidia/*/lib/*.so             the CUDA libraries LibTorch loads
  lib/system/*.so                   only with --with-system-libs
  share/materializer/
    debian-packages.txt             what the host must install from Debian
    BUILDINFO.json                  versions, CUDA runtime and minimum driver,
                                    whether the CUDA kernels were compiled

The LibTorch side keeps the wheel's own layout (lib/torch/lib beside
lib/nvidia), so the wheel's libraries need no change: their RPATHs
($ORIGIN/../../nvidia/cu13/lib, ...) stay correct. Only our two binaries
are patched (patchelf). Every other library (gRPC, protobuf, abseil,
OpenSSL, xxHash, zlib, prometheus-cpp) comes from the Debian packages
listed in deploy/runtime-packages.txt, unless --with-system-libs copies
them in (for hosts that are not Debian bookworm; glibc is never copied, so
the host's glibc must be 2.36 or newer).

Which LibTorch libraries: everything the server's ELF dependencies reach
(as the dynamic loader resolves them), plus the ones LibTorch opens
itself at run time on paths the server can take: libtorch_cuda_linalg
(QR for orthogonal init on a GPU) and NVRTC (kernels LibTorch compiles at
run time). Left out: cuDNN's engine libraries and NVSHMEM's transports,
which LibTorch opens only for convolutions and symmetric memory, and
libcuda/libnvidia-ml, which belong to the host's driver (the NVIDIA
container runtime mounts them).

--without-libtorch leaves lib/torch and lib/nvidia out (a few MiB instead
of GiBs) for a host that has the same torch wheel installed: link it in
with `ln -s <site-packages>/torch <bundle>/lib/torch` (the wheel's own
RPATHs then reach <site-packages>/nvidia through that link).

Usage:
  tools/bundle.py --server bazel-bin/server/materializerd \\
      --matctl bazel-bin/client/matctl --out .build/bundle \\
      [--without-libtorch] [--with-system-libs] [--hardlink] \\
      [--buildinfo bazel-bin/server/init/portable/portable_kernel_cuda.nvcc.txt]

An up-to-date bundle (same inputs, same options) is left as it is; the
bundle is built in a sibling folder and moved into place, so a failed run
never leaves half a bundle behind.
"""

import argparse
import ctypes
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_PACKAGES = REPO / "deploy" / "runtime-packages.txt"

# Libraries LibTorch dlopens on paths the server takes (see the module doc).
LIBTORCH_RUNTIME_LOADS = [
    "libtorch_cuda_linalg.so",
    "libcaffe2_nvrtc.so",
]
# Opened by NVRTC from its own folder.
NVRTC_BUILTINS_RE = re.compile(r"^libnvrtc-builtins\.so\.[0-9.]+$")

# glibc's libraries: always the host's own (they must match its loader).
GLIBC = {
    "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2",
    "libpthread.so.0", "librt.so.1", "libutil.so.1", "libresolv.so.2",
    "linux-vdso.so.1",
}
# The NVIDIA driver's libraries: provided by the host (on Kubernetes, by
# the NVIDIA container runtime), never bundled.
DRIVER = {"libcuda.so.1", "libnvidia-ml.so.1"}

# NVIDIA's minimum Linux driver per CUDA major version under minor version
# compatibility (CUDA Compatibility guide, "Minor Version Compatibility"):
# CUDA 12.x needs >= 525, CUDA 13.x needs >= 580.
MIN_DRIVER = {11: "450", 12: "525", 13: "580"}

# Only what the tools need, so the result does not depend on the caller's
# environment (LD_LIBRARY_PATH above all).
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


class BundleError(Exception):
    pass


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True,
                            env=CLEAN_ENV, **kw)
    if result.returncode != 0:
        raise BundleError(f"{' '.join(map(str, cmd))} failed "
                          f"({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def dynamic_paths(binary):
    """The RUNPATH (or RPATH) entries of an ELF file."""
    out = run(["readelf", "-d", str(binary)])
    paths = []
    for line in out.splitlines():
        m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]",
                      line)
        if m:
            paths.extend(p for p in m.group(1).split(":") if p)
    return paths


LDD_RE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|\S+)")


def ldd(path):
    """[(soname, resolved path or None)] as the dynamic loader resolves the
    ELF file's dependencies, transitively."""
    out = run(["ldd", str(path)])
    deps = []
    for line in out.splitlines():
        m = LDD_RE.match(line)
        if m:
            deps.append((m.group(1),
                         None if m.group(2) == "not found" else m.group(2)))
    return deps


def find_torch_lib(server):
    for entry in dynamic_paths(server):
        if "$ORIGIN" not in entry and (pathlib.Path(entry) / "libtorch.so").exists():
            return pathlib.Path(os.path.normpath(entry))
    raise BundleError(
        f"{server}: no RUNPATH entry holds libtorch.so (is it the binary "
        "Bazel linked, not a bundled copy?)")


def collect(server, matctl, torch_lib):
    """Splits every library the binaries (and LibTorch's run-time loads)
    resolve to into LibTorch-side files (under the folder that holds the
    torch root) and system files, keyed by soname."""
    base = torch_lib.parent.parent  # site-packages (or a LibTorch's parent)
    roots = [server, matctl]
    roots += [torch_lib / name for name in LIBTORCH_RUNTIME_LOADS
              if (torch_lib / name).exists()]
    wheel, system, missing = {}, {}, set()
    for root in roots:
        for soname, resolved in ldd(root):
            if soname in GLIBC:
                continue
            if resolved is None:
                if soname not in DRIVER:
                    missing.add(f"{soname} (needed by {root.name})")
                continue
            path = pathlib.Path(os.path.normpath(resolved))
            if path.is_relative_to(base):
                wheel[soname] = path
            elif soname not in DRIVER:
                system[soname] = path
    if missing:
        raise BundleError("unresolved libraries: " + ", ".join(sorted(missing)))
    for name in LIBTORCH_RUNTIME_LOADS:
        if (torch_lib / name).exists():
            wheel[name] = torch_lib / name
    nvrtc = [p for s, p in wheel.items() if s.startswith("libnvrtc.so")]
    for folder in {p.parent for p in nvrtc}:
        for f in folder.iterdir():
            if NVRTC_BUILTINS_RE.match(f.name):
                wheel[f.name] = f
    return base, wheel, system


def read_packages(path):
    return [line.split("#", 1)[0].strip()
            for line in pathlib.Path(path).read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def inputs_digest(args, files):
    h = hashlib.sha256()
    h.update(pathlib.Path(__file__).read_bytes())
    h.update(repr(sorted((k, str(v)) for k, v in vars(args).items()
                         if k != "out")).encode())
    for f in sorted(files):
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for f in (args.server, args.matctl, args.packages, *args.buildinfo):
        h.update(pathlib.Path(f).read_bytes())
    return h.hexdigest()


def place(src, dst, hardlink):
    dst.parent.mkdir(parents=True, exist_ok=True)
    if hardlink:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass  # another file system: copy
    shutil.copy2(src, dst)


def patch_binary(src, dst, search_path, transitive):
    """Copies `src` to `dst` with `search_path` as its library path.
    DT_RPATH when `transitive` (it then also applies to the libraries the
    binary loads, which bundled system libraries need), else DT_RUNPATH."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    dst.chmod(0o755)
    if search_path:
        cmd = ["patchelf", "--set-rpath", search_path, str(dst)]
        if transitive:
            cmd.insert(1, "--force-rpath")
    else:
        cmd = ["patchelf", "--remove-rpath", str(dst)]
    try:
        run(cmd)
    except FileNotFoundError:
        raise BundleError("patchelf is not installed (Debian package "
                          "patchelf; ./dev setup installs it)") from None


def cuda_runtime_version(libcudart):
    """(major, minor) of a CUDA runtime library, asked of the library itself
    (cudaRuntimeGetVersion needs neither a GPU nor a driver)."""
    lib = ctypes.CDLL(str(libcudart))
    version = ctypes.c_int(0)
    if lib.cudaRuntimeGetVersion(ctypes.byref(version)) != 0:
        raise BundleError(f"cudaRuntimeGetVersion failed in {libcudart}")
    return version.value // 1000, (version.value % 1000) // 10


def torch_version(torch_lib):
    version_py = torch_lib.parent / "version.py"
    if version_py.exists():
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)",
                      version_py.read_text())
        if m:
            return m.group(1)
    build_version = torch_lib.parent / "build-version"
    if build_version.exists():
        return build_version.read_text().strip()
    return "unknown"


def du(path):
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and not f.is_symlink())


def build(args):
    server, matctl = pathlib.Path(args.server), pathlib.Path(args.matctl)
    out = pathlib.Path(args.out)
    torch_lib = find_torch_lib(server)
    base, wheel, system = collect(server, matctl, torch_lib)
    packages = read_packages(args.packages)

    digest = inputs_digest(args, list(wheel.values()) + list(system.values()))
    info_path = out / "share" / "materializer" / "BUILDINFO.json"
    if info_path.exists():
        try:
            if json.loads(info_path.read_text()).get("inputs") == digest:
                print(f"{out}: up to date")
                return json.loads(info_path.read_text())
        except ValueError:
            pass

    stage = out.with_name(out.name + ".partial")
    shutil.rmtree(stage, ignore_errors=True)
    torch_rel = torch_lib.relative_to(base)  # torch/lib
    search = [f"$ORIGIN/../lib/{torch_rel}"]
    if args.with_system_libs:
        search.append("$ORIGIN/../lib/system")
    patch_binary(server, stage / "bin" / "materializerd", ":".join(search),
                 transitive=args.with_system_libs)
    patch_binary(matctl, stage / "bin" / "matctl",
                 "$ORIGIN/../lib/system" if args.with_system_libs else "",
                 transitive=args.with_system_libs)

    if not args.without_libtorch:
        for path in wheel.values():
            place(path, stage / "lib" / path.relative_to(base), args.hardlink)
    if args.with_system_libs:
        for soname, path in system.items():
            place(path, stage / "lib" / "system" / soname, hardlink=False)

    share = stage / "share" / "materializer"
    share.mkdir(parents=True, exist_ok=True)
    (share / "debian-packages.txt").write_text("\n".join(packages) + "\n")

    info = {
        "torch": torch_version(torch_lib),
        "libtorch": "not bundled: ln -s <site-packages>/torch lib/torch"
                    if args.without_libtorch else "bundled",
        "system_libraries": "bundled in lib/system (glibc >= 2.36 needed)"
                            if args.with_system_libs else
                            "from the Debian packages in debian-packages.txt",
        "cuda_kernels": "; ".join(
            pathlib.Path(f).read_text().strip() for f in args.buildinfo)
        or "not recorded",
    }
    cudart = next((p for s, p in wheel.items() if s.startswith("libcudart.so")),
                  None)
    if cudart is not None:
        major, minor = cuda_runtime_version(cudart)
        info["cuda_runtime"] = f"{major}.{minor}"
        info["min_nvidia_driver"] = MIN_DRIVER.get(major, "unknown")
    else:
        info["cuda_runtime"] = "none (CPU-only LibTorch)"
    info["bytes"] = du(stage)
    info["inputs"] = digest
    (share / "BUILDINFO.json").write_text(json.dumps(info, indent=2) + "\n")

    shutil.rmtree(out, ignore_errors=True)
    stage.rename(out)
    print(f"{out}: {info['bytes'] / 2**20:.0f} MiB, torch {info['torch']}, "
          f"CUDA runtime {info['cuda_runtime']}"
          + (f" (driver >= {info['min_nvidia_driver']})"
             if "min_nvidia_driver" in info else ""))
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True,
                        help="materializerd as Bazel linked it")
    parser.add_argument("--matctl", required=True,
                        help="matctl as Bazel linked it")
    parser.add_argument("--out", required=True, help="bundle folder")
    parser.add_argument("--packages", default=str(DEFAULT_PACKAGES),
                        help="Debian packages the host installs "
                        "(default deploy/runtime-packages.txt)")
    parser.add_argument("--without-libtorch", action="store_true",
                        help="leave LibTorch and the CUDA libraries out")
    parser.add_argument("--with-system-libs", action="store_true",
                        help="also carry gRPC, protobuf, abseil, ... (for "
                        "hosts without the Debian packages)")
    parser.add_argument("--hardlink", action="store_true",
                        help="hard-link the wheel's libraries instead of "
                        "copying them (same file system; never modify them)")
    parser.add_argument("--buildinfo", action="append", default=[],
                        help="a text file to record in BUILDINFO.json "
                        "(e.g. which nvcc built the CUDA kernels)")
    args = parser.parse_args(argv)
    try:
        build(args)
    except BundleError as error:
        print(f"bundle: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
