"""deploy/Dockerfile's promises, checked statically (no container engine
runs here): two image variants, gpu (the default target: CUDA kernels,
LibTorch's CUDA libraries) and cpu (LibTorch's +cpu build, nothing of
CUDA), each a slim runtime stage that holds one bundle made by
`./dev package` and the Debian packages it lists, as a non-root user,
with no compiler, Bazel or sources; every base image pinned by digest;
and a .dockerignore that keeps the venv, Bazel outputs, .git and large
weight files out of the build context and every source in it."""

import fnmatch
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import serverproc

REPO = pathlib.Path(serverproc.REPO)
sys.path.insert(0, str(REPO / "tools"))
import bundle as bundler  # noqa: E402  (tools/bundle.py)

DOCKERFILE = REPO / "deploy" / "Dockerfile"
PACKAGES = REPO / "deploy" / "runtime-packages.txt"
PACKAGES_IN_CONTEXT = "deploy/runtime-packages.txt"
BUNDLE_PREFIX = "/opt/materializer"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VARIANTS = {"gpu": "build-gpu", "cpu": "build-cpu"}
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")

# Compilers, build systems and -dev packages, as whole words.
BUILD_TOOLS = re.compile(
    r"(?<![\w.+-])(gcc|g\+\+|clang(-\d+)?|cc1plus|build-essential|"
    r"bazel(-bootstrap)?|nvcc|cuda-toolkit[-\w]*|make|cmake|[\w.+-]+-dev)"
    r"(?![\w.+-])")


def instructions(text):
    """[(KEYWORD, arguments)] with continuation lines joined, comments and
    blank lines dropped."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, args = " ".join(current.split()).partition(" ")
        out.append((keyword.upper(), args))
        current = ""
    return out


class Stage:
    def __init__(self, name, base, steps):
        self.name, self.base, self.steps = name, base, steps


def stages(text):
    """(global ARG defaults, {stage name: Stage}) in order; ARGs before the
    first FROM are substituted into FROM lines with their defaults."""
    args, result, current = {}, {}, None
    for keyword, rest in instructions(text):
        if keyword == "ARG" and current is None:
            key, _, value = rest.partition("=")
            args[key] = value
            continue
        if keyword == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert m, rest
            base = re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)],
                          m.group(1))
            current = Stage(m.group(2) or f"stage{len(result)}", base, [])
            result[current.name] = current
            continue
        current.steps.append((keyword, rest))
    return args, result


@pytest.fixture(scope="module")
def dockerfile():
    return stages(DOCKERFILE.read_text())


def chain(all_stages, name):
    """The stage and the stages it is built FROM, base first."""
    out = []
    while name in all_stages:
        out.insert(0, all_stages[name])
        name = all_stages[name].base
    return out


def image_of(all_stages, name):
    """The external image a stage is ultimately built FROM."""
    return chain(all_stages, name)[0].base


def steps_of(all_stages, name):
    """Every instruction that makes the stage's image, its bases' first."""
    return [s for stage in chain(all_stages, name) for s in stage.steps]


def stages_used(all_stages, name):
    """Every stage (and external image) building `name` reads: its FROM
    chain, COPY --from and RUN --mount from= sources, transitively."""
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in all_stages:
            continue
        todo.append(all_stages[n].base)
        for keyword, rest in all_stages[n].steps:
            if keyword in ("COPY", "RUN"):
                todo += re.findall(r"--from=([\w.-]+)", rest)
                todo += re.findall(r"--mount=\S*\bfrom=([\w.-]+)", rest)
    return seen


def bundle_copies(steps):
    return [rest for k, rest in steps
            if k in ("COPY", "ADD") and BUNDLE_PREFIX in rest]


def package_command(steps):
    """The `./dev package` invocation of a build stage's RUN."""
    runs = " ".join(rest for k, rest in steps if k == "RUN")
    found = re.findall(r"\./dev package(?: --[\w-]+(?:=\S+)?)*", runs)
    assert len(found) == 1, runs
    return found[0].split()[2:]


# ---- base images ----------------------------------------------------------


def test_every_base_image_is_pinned_by_digest(dockerfile):
    args, all_stages = dockerfile
    external = {s.name: s.base for s in all_stages.values()
                if s.base not in all_stages}
    assert len(external) >= 3, external  # cuda toolkit, build, runtime
    for name, image in external.items():
        # A readable tag for people and a digest for the builder (which
        # pulls by the digest alone).
        assert DIGEST.search(image), f"{name}: {image} is not pinned by digest"
        reference = image.split("@")[0]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", reference), (name, image)
    # The build and the runtime come from one dated Debian snapshot.
    debian = {n: i.split("@")[0] for n, i in external.items()
              if i.startswith("debian:")}
    dates = {re.fullmatch(r"debian:bookworm-(\d{8})(-slim)?", ref).group(1)
             for ref in debian.values()}
    assert len(debian) == 2 and len(dates) == 1, debian
    # The CUDA image's digest is a build argument that goes with its tag.
    assert DIGEST.search("@" + args["CUDA_DIGEST"]), args["CUDA_DIGEST"]
    assert external["cuda"].startswith(
        f"nvidia/cuda:{args['CUDA_VERSION']}-devel-"), external["cuda"]
    print("; ".join(f"{n}: {i[:40]}...{i[-8:]}" for n, i in external.items()))


def test_readme_names_the_pinned_images(dockerfile):
    """deploy/README.md's update procedure names the tags this file pins."""
    _, all_stages = dockerfile
    readme = (REPO / "deploy" / "README.md").read_text()
    for stage in all_stages.values():
        if stage.base not in all_stages and stage.base.startswith("debian:"):
            tag = stage.base.split("@")[0]
            assert tag in readme, tag


# ---- build stages ---------------------------------------------------------


def test_gpu_build_compiles_cuda_kernels_and_makes_the_bundle(dockerfile):
    args, all_stages = dockerfile
    assert image_of(all_stages, "build-gpu").startswith("debian:bookworm")
    steps = steps_of(all_stages, "build-gpu")
    # --cuda (--config=cuda): the build fails without nvcc rather than
    # shipping the host stubs of the CUDA kernels.
    assert package_command(steps) == ["--cuda", "--out=/bundle"]
    assert any(k == "COPY" and "--from=cuda" in rest and "/usr/local/cuda" in rest
               for k, rest in steps)
    assert ("ENV", "CUDA_HOME=/usr/local/cuda") in steps
    # The toolkit the digest names is checked against CUDA_VERSION.
    runs = " ".join(rest for k, rest in steps if k == "RUN")
    assert 'nvcc --version | grep -q "release ${CUDA_VERSION%.*},"' in runs
    # The toolkit's CUDA is the torch wheel's.
    import torch
    if torch.version.cuda:
        assert args["CUDA_VERSION"].startswith(torch.version.cuda + "."), \
            (args["CUDA_VERSION"], torch.version.cuda)


def test_cpu_build_takes_cpu_torch_and_nothing_of_cuda(dockerfile, tmp_path):
    _, all_stages = dockerfile
    used = stages_used(all_stages, "cpu")
    assert "cuda" not in used and "build-gpu" not in used, used
    assert not any(i.startswith("nvidia/") for i in used), used
    steps = steps_of(all_stages, "build-cpu")
    assert package_command(steps) == ["--out=/bundle"]
    assert not any("CUDA_HOME" in rest for _, rest in steps)
    run = next(rest for k, rest in steps if k == "RUN" and "./dev package" in rest)
    assert f"PIP_EXTRA_INDEX_URL={CPU_INDEX}" in run
    assert "PIP_CONSTRAINT=/tmp/torch-cpu.txt" in run
    # The bundle it made has no CUDA library, or the build fails.
    assert "test ! -e /bundle/lib/nvidia" in run
    assert '"cuda_runtime": "none' in run
    # The constraint is requirements.txt's torch as its +cpu build: run the
    # stage's own command on a copy of requirements.txt.
    make = re.search(r"(sed -n '[^']*' requirements\.txt > /tmp/torch-cpu\.txt)",
                     run)
    assert make, run
    shutil.copy(REPO / "requirements.txt", tmp_path / "requirements.txt")
    command = make.group(1).replace("/tmp/torch-cpu.txt", "torch-cpu.txt")
    subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True)
    pinned = re.search(r"^torch==(\S+)", (REPO / "requirements.txt").read_text(),
                       re.MULTILINE).group(1)
    assert (tmp_path / "torch-cpu.txt").read_text() == f"torch=={pinned}+cpu\n"


# ---- runtime stages -------------------------------------------------------


def test_variants_are_the_runtime_stage_with_their_own_bundle(dockerfile):
    _, all_stages = dockerfile
    # Without --target a build makes the last stage: the gpu image.
    assert list(all_stages)[-1] == "gpu"
    runtime = {}
    for variant, build in VARIANTS.items():
        stages_chain = chain(all_stages, variant)
        assert re.fullmatch(r"debian:bookworm-\d{8}-slim@sha256:[0-9a-f]{64}",
                            stages_chain[0].base), stages_chain[0].base
        runtime[variant] = stages_chain[0].name
        steps = steps_of(all_stages, variant)
        assert [k for k, _ in steps if k == "ADD"] == []
        # One COPY: the bundle its own build stage wrote.
        copies = [rest for k, rest in steps if k == "COPY"]
        out = package_command(steps_of(all_stages, build))[-1]
        assert out.startswith("--out=")
        assert copies == [f"--from={build} {out[len('--out='):]} "
                          f"{BUNDLE_PREFIX}"], (variant, copies)
    # One runtime for both: they differ only in the bundle (and the NVIDIA
    # runtime's settings).
    assert runtime["cpu"] == runtime["gpu"]


def test_runtime_installs_only_the_listed_runtime_packages(dockerfile):
    _, all_stages = dockerfile
    for variant in VARIANTS:
        steps = steps_of(all_stages, variant)
        for keyword, rest in steps:
            if keyword != "RUN":
                continue
            tools = [m.group(0) for m in BUILD_TOOLS.finditer(rest)]
            assert not tools, f"runtime RUN installs build tools: {tools}"
            for word in shlex.split(rest):
                if word.startswith("-"):
                    continue
                # Packages come only from the list.
                assert not re.fullmatch(r"lib[\w.+-]+", word), word
        run = " ".join(rest for k, rest in steps if k == "RUN")
        assert (f"--mount=type=bind,source={PACKAGES_IN_CONTEXT},"
                "target=/tmp/runtime-packages.txt") in run
        assert ("sed 's/#.*//' /tmp/runtime-packages.txt | xargs apt-get "
                "install -y -qq --no-install-recommends") in run
        assert "rm -rf /var/lib/apt/lists/*" in run


def test_package_list_command_yields_the_listed_packages(dockerfile):
    """The runtime's `sed | xargs` reads the list as tools/bundle.py does
    (which writes it into every bundle): run its own command on the list."""
    _, all_stages = dockerfile
    run = " ".join(rest for k, rest in steps_of(all_stages, "gpu") if k == "RUN")
    m = re.search(r"(sed '[^']*') /tmp/runtime-packages\.txt \| xargs", run)
    assert m, run
    out = subprocess.run(["sh", "-c", f"{m.group(1)} {shlex.quote(str(PACKAGES))}"
                          " | xargs echo"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == bundler.read_packages(PACKAGES)


def test_runtime_packages_are_runtime_libraries_only():
    packages = [line.split("#")[0].strip()
                for line in PACKAGES.read_text().splitlines()]
    packages = [p for p in packages if p]
    assert packages
    for p in packages:
        assert not BUILD_TOOLS.search(p), p


def test_runtime_runs_as_a_numeric_non_root_user(dockerfile):
    _, all_stages = dockerfile
    for variant in VARIANTS:
        steps = steps_of(all_stages, variant)
        users = [i for i, (k, _) in enumerate(steps) if k == "USER"]
        assert users, f"{variant}: no USER"
        m = re.fullmatch(r"(\d+):(\d+)", steps[users[-1]][1])
        assert m and int(m.group(1)) != 0 and int(m.group(2)) != 0, \
            steps[users[-1]]
        # Nothing runs as root after the switch, and the bundle's files
        # are root's (COPY without --chown): the server cannot change them.
        assert all(k != "RUN" for k, _ in steps[users[-1]:])
        assert not any("--chown" in rest for k, rest in steps if k == "COPY")
        # The user exists in the image with that id.
        run = " ".join(rest for k, rest in steps if k == "RUN")
        assert f"useradd --uid {m.group(1)} --gid {m.group(2)}" in run


def test_entrypoint_is_the_bundled_server_without_insecure_flags(dockerfile):
    _, all_stages = dockerfile
    assert "--allow_insecure_remote" not in DOCKERFILE.read_text()
    import torch
    for variant in VARIANTS:
        steps = steps_of(all_stages, variant)
        entry = [rest for k, rest in steps if k == "ENTRYPOINT"]
        assert entry == [f'["{BUNDLE_PREFIX}/bin/materializerd"]'], entry
        exposed = " ".join(rest for k, rest in steps if k == "EXPOSE").split()
        assert {"50051", "8081", "9464"} <= set(exposed), exposed
        env = " ".join(rest for k, rest in steps if k == "ENV")
        assert f"PATH={BUNDLE_PREFIX}/bin:" in env
        if variant == "gpu":
            if torch.version.cuda:
                assert f'NVIDIA_REQUIRE_CUDA="cuda>={torch.version.cuda}"' \
                    in env, env
            assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
        else:
            assert "NVIDIA_" not in env, env


# ---- build context --------------------------------------------------------


def dockerignored(path, patterns):
    """Whether the build context leaves `path` out (Docker's rules, for
    the plain patterns used here: the last matching line wins)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern[1:] if negate else pattern
        p = p.removeprefix("**/")
        parts = pathlib.PurePosixPath(path).parts
        # A pattern matches the path or any folder above it.
        hit = any(fnmatch.fnmatchcase("/".join(parts[:i + 1]), p) or
                  fnmatch.fnmatchcase(parts[i], p)
                  for i in range(len(parts)))
        if hit:
            ignored = not negate
    return ignored


@pytest.fixture(scope="module")
def ignore_patterns():
    return [line.strip() for line in
            (REPO / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_dockerignore_keeps_the_build_products_out(ignore_patterns):
    for path in (".venv", ".venv/lib/python3.11/site-packages/torch",
                 "bazel-bin", "bazel-out/k8-opt", "bazel-materializer",
                 ".git", ".git/objects", ".build", ".build/bundle",
                 "server/__pycache__/x.pyc", "python/build/lib",
                 "python/materializer.egg-info/PKG-INFO",
                 # What the README's tour or a script may leave behind.
                 "gpt2.safetensors", "examples/out/model.safetensors",
                 "checkpoint.pt"):
        assert dockerignored(path, ignore_patterns), path
    # The sources the build stages need stay in.
    for path in ("dev", "WORKSPACE", "server/main.cc", "deploy/Dockerfile",
                 PACKAGES_IN_CONTEXT, "tools/bundle.py",
                 "requirements.txt", "third_party/libtorch/libtorch.bzl"):
        assert not dockerignored(path, ignore_patterns), path


def test_dockerignore_keeps_every_tracked_file_in(ignore_patterns):
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True,
                         text=True)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout ({out.stderr.strip()})")
    tracked = out.stdout.splitlines()
    assert len(tracked) > 100, len(tracked)
    left_out = [p for p in tracked if dockerignored(p, ignore_patterns)]
    assert not left_out, f"sources left out of the build context: {left_out[:20]}"
