"""The package installs with pip into a fresh venv, without Bazel, and
the README's "From a trainer" example runs against a server.

The venv sees the project venv's packages through a .pth file (torch is
not downloaded again: the package asks for the torch minor the tests
cover, which the project venv's torch is); `pip install` builds the
package from a copy of python/ and proto/ (the generated code comes from
proto/ at build time) with build isolation, which fetches setuptools and
grpcio-tools from PyPI (pip's cache makes that quick). Without network
access to PyPI the build falls back to the tools the project venv already
has (said in the output).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

import serverproc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def readme_example():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- readme-example:[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its example block"
    return m.group(1)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdk-venv")
    src = root / "checkout"
    shutil.copytree(os.path.join(REPO, "python"), src / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(os.path.join(REPO, "proto"), src / "proto")
    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "project-venv.pth"), "w", encoding="utf-8") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    done = subprocess.run(pip + [str(src / "python")], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        print("isolated build failed (no PyPI?); building with the project venv's "
              f"setuptools and grpcio-tools:\n{done.stderr[-2000:]}")
        done = subprocess.run(pip + ["--no-build-isolation", str(src / "python")],
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return py


def clean_env():
    env = dict(os.environ)
    for key in list(env):
        if key == "PYTHONPATH" or key.startswith("MATERIALIZER_"):
            env.pop(key)
    return env


def test_the_torch_requirement_is_the_tested_range(venv, tmp_path):
    """The installed package asks for the torch minor the tests run
    (requirements.txt's pin), and pip kept the project venv's torch
    instead of fetching another."""
    from packaging.requirements import Requirement
    from packaging.version import Version
    check = ("import importlib.metadata as m, json, torch\n"
             "print(json.dumps([m.requires('materializer'), torch.__version__, torch.__file__]))\n")
    out = subprocess.run([str(venv), "-c", check], capture_output=True, text=True, cwd=tmp_path,
                         env=clean_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    requires, version, location = json.loads(out.stdout)
    torch_req = [Requirement(r) for r in requires if Requirement(r).name == "torch"]
    assert len(torch_req) == 1, requires
    spec = torch_req[0].specifier
    pinned = re.search(r"^torch==(\S+)$",
                       open(os.path.join(REPO, "requirements.txt"), encoding="utf-8").read(),
                       re.M).group(1)
    tested = Version(pinned)
    assert spec.contains(tested), (str(spec), pinned)
    # Exactly that minor: no older torch, no newer one that nothing tested.
    assert not spec.contains(f"{tested.major}.{tested.minor + 1}.0"), str(spec)
    assert not spec.contains(f"{tested.major}.{tested.minor - 1}.0"), str(spec)
    assert Version(version).base_version == pinned
    assert not location.startswith(str(venv.parent.parent))  # the project venv's copy


def test_the_installed_package_carries_code_generated_from_the_proto(venv, tmp_path):
    check = (
        "import materializer, materializer.v1.materializer_pb2 as pb\n"
        "print(materializer.__file__)\n"
        "import sys; sys.stdout.buffer.write(pb.DESCRIPTOR.serialized_pb)\n")
    out = subprocess.run([str(venv), "-c", check], capture_output=True, cwd=tmp_path,
                         env=clean_env(), timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    path, _, blob = out.stdout.partition(b"\n")
    assert str(venv.parent.parent) in path.decode()      # the venv's copy, not the checkout's
    from google.protobuf import descriptor_pb2
    from materializer.v1 import materializer_pb2 as ours
    installed = descriptor_pb2.FileDescriptorProto.FromString(blob)
    checkout = descriptor_pb2.FileDescriptorProto.FromString(ours.DESCRIPTOR.serialized_pb)
    assert installed == checkout
    assert not os.path.exists(os.path.join(REPO, "python", "materializer", "v1"))


def test_readme_example_runs_against_a_server(venv, tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    with serverproc.running_server() as srv:
        code = code.replace("127.0.0.1:50051", srv.address)
        out = subprocess.run([str(venv), "-c", code], capture_output=True, text=True,
                             cwd=tmp_path, env=clean_env(), timeout=300)
        assert out.returncode == 0, out.stderr
        assert re.match(r"shm [\d,]+ bytes in [\d.]+ s", out.stdout), out.stdout
        srv.assert_idle()
