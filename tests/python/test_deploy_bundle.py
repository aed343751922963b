"""The runtime bundle (tools/bundle.py, `./dev package`): placed in an empty
folder, it runs with an empty environment (`env -i`), every library it
loads resolves inside it or to a Debian package the image installs, and a
materialize/fetch round trip through the bundled matctl gives the bytes
the development build gives.

The bundle is built from the binaries under test (MATERIALIZERD and the
matctl beside it) into .build/test-bundle, and reused while its inputs are
unchanged; the wheel's libraries are hard links, so it costs seconds and
no disk."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

import matutil
import serverproc

REPO = pathlib.Path(serverproc.REPO)
sys.path.insert(0, str(REPO / "tools"))
import bundle as bundler  # noqa: E402  (tools/bundle.py)

SERVER = pathlib.Path(serverproc.SERVER_BIN)
MATCTL = SERVER.parent.parent / "client" / "matctl"
WORK = REPO / ".build"
PACKAGES = REPO / "deploy" / "runtime-packages.txt"
# Present in every debian:bookworm-slim (apt itself needs them).
SLIM_BASE = ["libc6", "libgcc-s1", "libstdc++6"]
EMPTY_ENV = ["env", "-i"]
CARRY_LIMIT = 64 << 20


def make_bundle(out, *extra):
    if not MATCTL.exists():
        pytest.fail(f"matctl not found at {MATCTL} (bazel build //client:matctl)",
                    pytrace=False)
    rc = bundler.main(["--server", str(SERVER), "--matctl", str(MATCTL),
                       "--out", str(out), "--hardlink", *extra])
    assert rc == 0, "tools/bundle.py failed (its error is printed above)"
    return out


def unpack(bundle, dest):
    """The bundle in an empty folder, as a copy made with hard links."""
    shutil.rmtree(dest, ignore_errors=True)
    for src in bundle.rglob("*"):
        target = dest / src.relative_to(bundle)
        if src.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(src))
        elif src.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, target)
            except OSError:
                shutil.copy2(src, target)
    return dest


@pytest.fixture(scope="module")
def bundle():
    built = make_bundle(WORK / "test-bundle")
    where = unpack(built, WORK / f"test-bundle-unpacked-{os.getpid()}")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def elf_files(root):
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.is_symlink():
            with open(f, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    yield f


def installed_depends(package):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Depends},${Pre-Depends}",
                          package], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    names = []
    for clause in out.stdout.split(","):
        for alternative in clause.split("|"):
            name = alternative.strip().split(" ")[0].split(":")[0]
            if name:
                names.append(name)
    return names


def package_closure(roots):
    """The packages and everything they depend on (as installed here)."""
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(installed_depends(p))
    return seen


def package_files(packages):
    """{file path: package} for the files of `packages` (dpkg -L)."""
    owner = {}
    for p in packages:
        out = subprocess.run(["dpkg-query", "-L", p], capture_output=True,
                             text=True)
        for line in out.stdout.splitlines():
            owner[line.strip()] = p
    return owner


def owner_of(path, owner):
    """The package (among `owner`'s) a library file belongs to. dpkg records
    either the /lib or the /usr/lib spelling of merged-/usr paths, and a
    soname is often a symlink to the versioned file."""
    for p in (path, os.path.realpath(path)):
        for spelling in (p, "/usr" + p if p.startswith("/lib/") else
                         p[len("/usr"):] if p.startswith("/usr/lib/") else p):
            if spelling in owner:
                return owner[spelling]
    return None


def test_buildinfo_states_versions_and_the_driver_it_needs(bundle):
    info = json.loads(
        (bundle / "share" / "materializer" / "BUILDINFO.json").read_text())
    import torch
    assert info["torch"] == torch.__version__
    assert info["libtorch"] == "bundled"
    if torch.version.cuda:
        # Read from the bundled libcudart itself.
        major, minor = torch.version.cuda.split(".")[:2]
        assert info["cuda_runtime"] == f"{major}.{minor}"
        assert info["min_nvidia_driver"] == bundler.MIN_DRIVER[int(major)]
    listed = (bundle / "share" / "materializer" / "debian-packages.txt"
              ).read_text().split()
    assert listed == bundler.read_packages(PACKAGES)
    print(f"bundle: {info['bytes'] / 2**20:.0f} MiB; CUDA runtime "
          f"{info['cuda_runtime']}; driver >= "
          f"{info.get('min_nvidia_driver', 'n/a')}; {info['cuda_kernels']}")


def test_no_search_path_leads_out_of_the_bundle(bundle):
    for f in elf_files(bundle):
        for entry in bundler.dynamic_paths(f):
            assert entry.startswith(("$ORIGIN", "${ORIGIN}")), \
                f"{f}: search path {entry}"


def test_every_library_resolves_inside_the_bundle_or_to_debian(bundle):
    allowed = package_files(
        package_closure(bundler.read_packages(PACKAGES) + SLIM_BASE))
    problems, from_debian = [], {}
    for f in elf_files(bundle):
        out = subprocess.run([*EMPTY_ENV, "ldd", str(f)], capture_output=True,
                             text=True)
        assert out.returncode == 0, (f, out.stderr)
        for line in out.stdout.splitlines():
            m = bundler.LDD_RE.match(line)
            if not m:
                continue
            soname, where = m.groups()
            if where == "not found":
                # The driver's library: mounted by the NVIDIA runtime.
                if soname not in bundler.DRIVER:
                    problems.append(f"{f.name}: {soname} not found")
                continue
            resolved = pathlib.Path(os.path.normpath(where))
            if resolved.is_relative_to(bundle):
                continue
            package = owner_of(str(resolved), allowed)
            if package is None:
                problems.append(f"{f.name}: {soname} -> {resolved}, not a "
                                "file of the listed Debian packages")
            else:
                from_debian[soname] = package
    assert not problems, "\n".join(problems)
    # The bundle carries LibTorch; Debian gives gRPC and the rest.
    assert "libtorch_cpu.so" not in from_debian
    assert from_debian.get("libgrpc++.so.1.51") == "libgrpc++1.51"


def test_help_under_an_empty_environment(bundle):
    out = subprocess.run([*EMPTY_ENV, str(bundle / "bin" / "materializerd"),
                          "--help"], capture_output=True, text=True,
                         timeout=60)
    assert "--health_listen" in out.stdout, out.stdout + out.stderr
    assert "--tls_client_ca" in out.stdout
    out = subprocess.run([*EMPTY_ENV, str(bundle / "bin" / "matctl"),
                          "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "materialize" in out.stdout, out


def test_materialize_fetch_round_trip_under_an_empty_environment(
        bundle, server, tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*EMPTY_ENV, str(bundle / "bin" / "materializerd"),
             "--listen=127.0.0.1:0", "--devices=cpu", "--cpu_capacity=1GiB"],
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline().decode()
        m = serverproc.LISTEN_RE.match(line)
        assert m, f"no listening line: {line!r}\n{log.read_text()}"

        def matctl(*args):
            out = subprocess.run(
                [*EMPTY_ENV, str(bundle / "bin" / "matctl"),
                 f"--server={m.group(1)}", "--client=bundle", *args],
                capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert out.returncode == 0, (args, out.stdout, out.stderr)
            return out.stdout

        example = REPO / "examples" / "mlp.json"
        handle = json.loads(matctl("materialize", str(example),
                                   "--output=json"))["handle"]
        matctl("fetch", handle, "-o", "mlp.safetensors")
        fetched = (tmp_path / "mlp.safetensors").read_bytes()
        matctl("release", handle)
        stats = json.loads(matctl("stats", "--output=json"))
        assert int(stats.get("inUseBytes", 0)) == 0, stats

        # The development build's server gives the same file.
        with server.handle(server.example("mlp.json"), "dev") as h:
            expected = server.fetch(h.handle, "dev")
        assert fetched == expected
        tensors = matutil.load_safetensors(fetched)
        model = json.loads(example.read_text())["model"]
        assert {t["name"]: list(t["shape"]) for t in model["tensors"]} == \
            {name: list(t.shape) for name, t in tensors.items()}
        assert bool((tensors["net.norm0.weight"] == 1).all())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()


def test_carry_without_libtorch_fits_and_resolves(tmp_path):
    """--without-libtorch --with-system-libs: what a machine with its own
    torch wheel but without the Debian packages needs, under 64 MiB."""
    carry = make_bundle(WORK / "test-carry", "--without-libtorch",
                        "--with-system-libs")
    size = sum(f.stat().st_size for f in carry.rglob("*")
               if f.is_file() and not f.is_symlink())
    assert size < CARRY_LIMIT, f"{size / 2**20:.1f} MiB"
    assert not (carry / "lib" / "torch").exists()
    where = unpack(carry, tmp_path / "carry")
    # The host's torch wheel, linked in as the bundle's doc says.
    torch_root = bundler.find_torch_lib(SERVER).parent
    (where / "lib" / "torch").symlink_to(torch_root)
    # The binaries' ldd lists everything they load, resolved as at run time
    # (the bundled system libraries are found through the binaries' RPATH).
    for f in sorted((where / "bin").iterdir()):
        out = subprocess.run([*EMPTY_ENV, "ldd", str(f)], capture_output=True,
                             text=True, check=True)
        for line in out.stdout.splitlines():
            m = bundler.LDD_RE.match(line)
            if m and m.group(1) not in bundler.GLIBC:
                assert m.group(2) != "not found", (f, line)
                assert pathlib.Path(os.path.normpath(m.group(2))) \
                    .is_relative_to(where), (f, line)
    out = subprocess.run([*EMPTY_ENV, str(where / "bin" / "materializerd"),
                          "--help"], capture_output=True, text=True,
                         timeout=60)
    assert "--health_listen" in out.stdout, out.stdout + out.stderr
    print(f"carry: {size / 2**20:.1f} MiB")


def test_torch_libraries_are_not_modified_by_bundling(bundle):
    """The wheel's libraries are placed as they are (hard links or copies):
    only bin/ is patched."""
    torch_lib = bundler.find_torch_lib(SERVER)
    base = torch_lib.parent.parent
    for f in (bundle / "lib").rglob("*.so*"):
        original = base / f.relative_to(bundle / "lib")
        assert original.exists(), f
        assert f.stat().st_size == original.stat().st_size, f
    # What LibTorch opens at run time travels too (QR on a GPU, NVRTC).
    for name in bundler.LIBTORCH_RUNTIME_LOADS:
        if (torch_lib / name).exists():
            assert (bundle / "lib" / torch_lib.relative_to(base) / name
                    ).exists(), name
    assert re.search(r"\$ORIGIN/\.\./lib/torch/lib",
                     " ".join(bundler.dynamic_paths(
                         bundle / "bin" / "materializerd")))


def test_cpu_only_libtorch_makes_a_bundle_without_cuda(tmp_path):
    """What the cpu image's build stage relies on: from a LibTorch without
    CUDA (the +cpu wheel's layout: torch/lib with libtorch, libtorch_cpu,
    libc10), the bundle has no lib/nvidia and BUILDINFO.json says so in
    the words deploy/Dockerfile checks for. Stand-in libraries and binaries
    of the same layout, built here, make it independent of the wheel this
    checkout has."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.fail("gcc is needed (./dev setup installs it)", pytrace=False)
    lib = tmp_path / "site-packages" / "torch" / "lib"
    lib.mkdir(parents=True)

    def build(out, source, *flags):
        src = tmp_path / (out.name + ".c")
        src.write_text(source)
        subprocess.run([cc, "-o", str(out), str(src), *flags], check=True)

    shared = ["-shared", "-fPIC", f"-L{lib}", "-Wl,-rpath,$ORIGIN"]
    build(lib / "libc10.so", "int c10(void) { return 10; }\n", *shared)
    build(lib / "libtorch_cpu.so",
          "int c10(void);\nint torch_cpu(void) { return c10() + 1; }\n",
          *shared, "-lc10")
    build(lib / "libtorch.so",
          "int torch_cpu(void);\nint torch(void) { return torch_cpu() + 1; }\n",
          *shared, "-ltorch_cpu")
    server, matctl = tmp_path / "materializerd", tmp_path / "matctl"
    build(server, "#include <stdio.h>\nint torch(void);\n"
          "int main(void) { printf(\"%d\\n\", torch()); return 0; }\n",
          f"-L{lib}", f"-Wl,-rpath,{lib}", "-Wl,--no-as-needed", "-ltorch",
          "-ltorch_cpu", "-lc10")
    build(matctl, "int main(void) { return 0; }\n")

    out = tmp_path / "bundle"
    rc = bundler.main(["--server", str(server), "--matctl", str(matctl),
                       "--out", str(out)])
    assert rc == 0
    assert not (out / "lib" / "nvidia").exists()
    assert sorted(p.name for p in (out / "lib" / "torch" / "lib").iterdir()) \
        == ["libc10.so", "libtorch.so", "libtorch_cpu.so"]
    where = unpack(out, tmp_path / "unpacked")
    run = subprocess.run([*EMPTY_ENV, str(where / "bin" / "materializerd")],
                         capture_output=True, text=True, timeout=60)
    assert run.stdout == "12\n", run
    info_text = (out / "share" / "materializer" / "BUILDINFO.json").read_text()
    assert json.loads(info_text)["cuda_runtime"].startswith("none")
    assert "min_nvidia_driver" not in json.loads(info_text)
    # The cpu stage of deploy/Dockerfile fails its build unless
    # BUILDINFO.json holds this text.
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    checked = re.search(r"grep -q '([^']+)' /bundle/share/materializer/"
                        r"BUILDINFO\.json", dockerfile)
    assert checked, "deploy/Dockerfile no longer checks BUILDINFO.json"
    assert checked.group(1) in info_text, (checked.group(1), info_text)
