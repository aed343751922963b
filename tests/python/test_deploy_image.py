"""deploy/Dockerfile's promises, checked statically (no container engine
runs here): a build stage that compiles the CUDA kernels and makes the
bundle with `./dev package`, a slim runtime stage that installs exactly
that bundle and its Debian packages as a non-root user, with no compiler,
Bazel or sources, and a .dockerignore that keeps the venv, Bazel outputs
and .git out of the build context."""

import fnmatch
import pathlib
import re
import shlex

import pytest

import serverproc

REPO = pathlib.Path(serverproc.REPO)
DOCKERFILE = REPO / "deploy" / "Dockerfile"
PACKAGES = REPO / "deploy" / "runtime-packages.txt"

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


def stages(text):
    """{stage name: (base image, [instructions])}, in order; ARGs before
    the first FROM are substituted with their defaults."""
    args, result, name = {}, {}, None
    for keyword, rest in instructions(text):
        if keyword == "ARG" and name is None:
            key, _, value = rest.partition("=")
            args[key] = value
            continue
        if keyword == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            image = re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)],
                           m.group(1))
            name = m.group(2) or f"stage{len(result)}"
            result[name] = (image, [])
            continue
        result[name][1].append((keyword, rest))
    return args, result


@pytest.fixture(scope="module")
def dockerfile():
    return stages(DOCKERFILE.read_text())


def runtime_stage(dockerfile):
    _, all_stages = dockerfile
    return list(all_stages.items())[-1]


def bundle_folder(build_steps):
    """Where the build stage's `./dev package` writes the bundle."""
    runs = " ".join(rest for k, rest in build_steps if k == "RUN")
    # --cuda (--config=cuda): the build fails without nvcc rather than
    # shipping the host stubs of the CUDA kernels.
    m = re.search(r"\./dev package --cuda --out=(\S+)", runs)
    assert m, runs
    return m.group(1)


def test_build_stage_compiles_cuda_kernels_and_makes_the_bundle(dockerfile):
    args, all_stages = dockerfile
    image, build = all_stages["build"]
    assert image.startswith("debian:bookworm"), image
    assert bundle_folder(build) == "/bundle"
    assert any(k == "COPY" and "--from=cuda" in rest and "/usr/local/cuda" in rest
               for k, rest in build)
    assert ("ENV", "CUDA_HOME=/usr/local/cuda") in build
    # The toolkit's CUDA is the torch wheel's.
    import torch
    if torch.version.cuda:
        assert args["CUDA_VERSION"].startswith(torch.version.cuda + "."), \
            (args["CUDA_VERSION"], torch.version.cuda)


def test_runtime_stage_is_slim_and_holds_only_the_bundle(dockerfile):
    name, (image, steps) = runtime_stage(dockerfile)
    assert re.fullmatch(r"debian:bookworm-slim", image), image
    copies = [rest for k, rest in steps if k in ("COPY", "ADD")]
    assert [k for k, _ in steps if k == "ADD"] == []
    # One COPY: the bundle that ./dev package wrote in the build stage.
    bundle_out = bundle_folder(dockerfile[1]["build"][1])
    assert copies == [f"--from=build {bundle_out} /opt/materializer"], copies
    for keyword, rest in steps:
        if keyword == "RUN":
            tools = [m.group(0) for m in BUILD_TOOLS.finditer(rest)]
            assert not tools, f"runtime RUN installs build tools: {tools}"
            for word in shlex.split(rest):
                if word.startswith("-"):
                    continue
                # Packages come only from the bundle's list.
                assert not re.fullmatch(r"lib[\w.+-]+", word), word
    run = " ".join(rest for k, rest in steps if k == "RUN")
    assert ("xargs -a /opt/materializer/share/materializer/"
            "debian-packages.txt apt-get install") in run
    assert "rm -rf /var/lib/apt/lists/*" in run


def test_runtime_packages_are_runtime_libraries_only():
    packages = [line.split("#")[0].strip()
                for line in PACKAGES.read_text().splitlines()]
    packages = [p for p in packages if p]
    assert packages
    for p in packages:
        assert not BUILD_TOOLS.search(p), p


def test_runtime_runs_as_a_numeric_non_root_user(dockerfile):
    _, (_, steps) = runtime_stage(dockerfile)
    users = [i for i, (k, _) in enumerate(steps) if k == "USER"]
    assert users, "no USER in the runtime stage"
    m = re.fullmatch(r"(\d+):(\d+)", steps[users[-1]][1])
    assert m and int(m.group(1)) != 0 and int(m.group(2)) != 0, \
        steps[users[-1]]
    # Nothing runs as root after the switch.
    assert all(k != "RUN" for k, _ in steps[users[-1]:])
    # The user exists in the image with that id.
    run = " ".join(rest for k, rest in steps if k == "RUN")
    assert f"useradd --uid {m.group(1)} --gid {m.group(2)}" in run


def test_entrypoint_is_the_bundled_server_without_insecure_flags(dockerfile):
    _, (_, steps) = runtime_stage(dockerfile)
    entry = [rest for k, rest in steps if k == "ENTRYPOINT"]
    assert entry == ['["/opt/materializer/bin/materializerd"]'], entry
    assert "--allow_insecure_remote" not in DOCKERFILE.read_text()
    exposed = " ".join(rest for k, rest in steps if k == "EXPOSE").split()
    assert {"50051", "8081", "9464"} <= set(exposed), exposed
    env = " ".join(rest for k, rest in steps if k == "ENV")
    import torch
    if torch.version.cuda:
        assert f'NVIDIA_REQUIRE_CUDA="cuda>={torch.version.cuda}"' in env, env
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env


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


def test_dockerignore_keeps_the_build_products_out():
    patterns = [line.strip() for line in
                (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for path in (".venv", ".venv/lib/python3.11/site-packages/torch",
                 "bazel-bin", "bazel-out/k8-opt", "bazel-materializer",
                 ".git", ".git/objects", ".build", ".build/bundle",
                 "server/__pycache__/x.pyc"):
        assert dockerignored(path, patterns), path
    # The sources the build stage needs stay in.
    for path in ("dev", "WORKSPACE", "server/main.cc", "deploy/Dockerfile",
                 "deploy/runtime-packages.txt", "tools/bundle.py",
                 "requirements.txt", "third_party/libtorch/libtorch.bzl"):
        assert not dockerignored(path, patterns), path
