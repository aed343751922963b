"""Capture layer: a meta nn.Module -> Spec, without a server.

    with materializer.capture.meta_device():     # or torch.device("meta")
        model = MyModel(config)
    spec = materializer.capture.describe(model, seed=0)
    print(spec.describe_steps())

The model's own init code (reset_parameters, its init hook) runs on the
meta tensors while a recorder turns each init call into a declarative
step (see describe.py and recorder.py). Pure: no network, nothing
allocated but meta tensors and small CPU values.
"""

from materializer.capture import schemes
from materializer.capture.describe import (COMPUTE_LIMIT, MAX_LITERAL_BYTES,
                                           MAX_TOTAL_LITERAL_BYTES, InitHook,
                                           default_hook, describe, meta_device)
from materializer.capture.program import Step
from materializer.capture.schemes import Scheme
from materializer.capture.spec import DTYPES, Spec, TensorDesc, dtype_name

__all__ = ["COMPUTE_LIMIT", "DTYPES", "InitHook", "MAX_LITERAL_BYTES",
           "MAX_TOTAL_LITERAL_BYTES", "Scheme", "Spec", "Step", "TensorDesc",
           "default_hook", "describe", "dtype_name", "meta_device", "schemes"]
