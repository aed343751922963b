"""Build hook: generate materializer.v1 (messages and gRPC stubs) from the
repository's proto/ with grpcio-tools, into the build tree.

`pip install ./python` builds in place, so ../proto is the contract of the
checkout being installed. MATERIALIZER_PROTO_ROOT points elsewhere (a folder
holding materializer/v1/materializer.proto).
"""

import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_FILE = os.path.join("materializer", "v1", "materializer.proto")


def proto_root():
    for root in (os.environ.get("MATERIALIZER_PROTO_ROOT"),
                 os.path.join(HERE, "proto"),
                 os.path.join(os.path.dirname(HERE), "proto")):
        if root and os.path.exists(os.path.join(root, PROTO_FILE)):
            return root
    raise SystemExit(
        f"materializer: {PROTO_FILE} not found next to python/ (build from a "
        "checkout of the repository, or set MATERIALIZER_PROTO_ROOT)")


def generate(out_dir):
    """Runs protoc (from grpcio-tools) on the contract into out_dir."""
    import grpc_tools
    from grpc_tools import protoc
    root = proto_root()
    includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["grpc_tools.protoc", f"-I{root}", f"-I{includes}",
            f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            os.path.join(root, PROTO_FILE)]
    if protoc.main(args) != 0:
        raise SystemExit(f"materializer: protoc failed on {PROTO_FILE}")
    pkg = os.path.join(out_dir, "materializer", "v1")
    init = os.path.join(pkg, "__init__.py")
    if not os.path.exists(init):
        with open(init, "w", encoding="utf-8") as f:
            f.write('"""Generated from proto/materializer/v1 at build time."""\n')


class BuildWithProtos(build_py):
    def run(self):
        super().run()
        generate(self.build_lib)


def protobuf_requirement():
    """The generated code checks that the runtime is at least the generator's
    protobuf version (same major)."""
    try:
        from importlib.metadata import version
        v = version("protobuf")
    except Exception:  # noqa: BLE001 (no metadata: leave the bound loose)
        return "protobuf>=5.26"
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", v).groups())
    return f"protobuf>={major}.{minor},<{major + 1}"


def grpcio_requirement():
    """The generated *_pb2_grpc.py refuses, at import, a grpcio older than
    the grpcio-tools that generated it; pip must know that too (a newer
    grpcio-tools on PyPI than the grpcio already installed broke the
    installed package's import otherwise)."""
    try:
        from importlib.metadata import version
        v = version("grpcio-tools")
    except Exception:  # noqa: BLE001 (no metadata: leave the bound loose)
        return "grpcio>=1.62"
    m = re.match(r"(\d+\.\d+\.\d+)", v)
    return f"grpcio>={m.group(1)}" if m else "grpcio>=1.62"


# The torch the tests cover: the project venv's (requirements.txt pins
# torch==2.11.0, whose LibTorch the server links). A looser bound lets pip
# pick a newer torch (and its CUDA wheels, gigabytes) that nothing tested.
TORCH_REQUIREMENT = "torch>=2.11,<2.12"

setup(
    cmdclass={"build_py": BuildWithProtos},
    install_requires=[
        TORCH_REQUIREMENT,
        grpcio_requirement(),
        protobuf_requirement(),
        "numpy",
        "xxhash>=3",
        "hpack>=4,<5",
        "tqdm",
    ],
)
