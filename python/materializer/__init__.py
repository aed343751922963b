"""materializer: from a PyTorch module on the meta device to initialized
weights, through materializerd.

    import materializer

    with materializer.meta_device():          # a drop-in for torch.device("meta")
        model = MyModel(config)
    materializer.materialize(model, server="127.0.0.1:50051", device="cpu")

The server and identity, when not passed, come from the variables matctl
reads (MATERIALIZER_SERVER, MATERIALIZER_TLS_CA, MATERIALIZER_TOKEN, ...:
materializer.client.env).

Layers (each usable alone; none imports the one above it):
  materializer.client   typed calls, sessions, identity, retries, errors
  materializer.capture  nn.Module (meta) -> Spec, from the model's own init code
  materializer.load     a handle's bytes -> the module's tensors, in place
and on top: materialize() (materializer.api), Hugging Face helpers
(materializer.hf), the memory estimate (python -m materializer plan).
"""

import os as _os
import pkgutil as _pkgutil

# materializer.v1 (generated) ships inside installed packages. In a checkout
# it is Bazel's output: MATERIALIZER_PY_PROTO names the folder that holds
# materializer/v1/ (bazel-bin/proto).
__path__ = _pkgutil.extend_path(__path__, __name__)
_generated = _os.environ.get("MATERIALIZER_PY_PROTO")
if _generated and not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "v1")):
    _extra = _os.path.join(_generated, "materializer")
    if _extra not in __path__:
        __path__.append(_extra)

from materializer.errors import (CaptureError, CheckpointLayoutError, Error,  # noqa: E402
                                 LoadError, RpcError)
from materializer.client import TLS, Client  # noqa: E402
from materializer.capture import (InitHook, Scheme, Spec, meta_device,  # noqa: E402
                                  schemes)
from materializer.api import describe, materialize, plan  # noqa: E402
from materializer.checkpoint import Checkpoint  # noqa: E402

init = schemes  # materializer.init.normal(std=0.02) for overrides

__version__ = "0.1.0"
__all__ = ["Checkpoint", "CaptureError", "CheckpointLayoutError", "Client", "Error",
           "InitHook", "LoadError", "RpcError", "Scheme", "Spec", "TLS", "describe", "init",
           "materialize", "meta_device", "plan", "schemes"]
