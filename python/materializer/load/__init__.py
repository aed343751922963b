"""Load layer: a handle's bytes -> the tensors inside the module.

    targets = Targets(model, spec)            # the module's meta tensors
    dests = targets.allocate("cpu")           # real, uninitialized, in place
    load_stream(client, handle, spec, dests)  # chunks straight into them
    # or, co-located: targets.adopt(shm_views(client.export(handle), spec))

Ties stay ties (one storage), Parameter objects are kept, DTensors get
their local shards.
"""

from materializer.load.export import copy_cuda_ipc, device_uuid, shm_views
from materializer.load.stream import fetch_fields, load_stream, raw_layout
from materializer.load.targets import Targets, check_loaded

__all__ = ["Targets", "check_loaded", "copy_cuda_ipc", "device_uuid",
           "fetch_fields", "load_stream", "raw_layout", "shm_views"]
