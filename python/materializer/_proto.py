"""The generated messages of the wire contract (proto/materializer/v1).

Installed packages carry them (generated at build time); in a checkout,
Bazel's output is used when MATERIALIZER_PY_PROTO points at it (see
materializer/__init__.py). gRPC stubs are imported by the client only.
"""

try:
    from materializer.v1 import materializer_pb2 as pb
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "materializer: the generated protocol code (materializer.v1) is "
        "missing. Install the package with `pip install ./python` (it is "
        "generated from proto/ at build time), or, in a checkout, set "
        "MATERIALIZER_PY_PROTO to Bazel's output folder (bazel-bin/proto after "
        "`bazel build //proto:materializer_py`).") from e

__all__ = ["pb"]
