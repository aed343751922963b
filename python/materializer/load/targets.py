"""Destination tensors inside the module.

`Targets` makes the module's meta tensors real, in place, with to_empty
semantics (allocated, not initialized), and hands the loaders one
destination tensor per root name of the spec:

- Parameter objects are kept (their `.data` is replaced), so ties (one
  Parameter under several names), optimizers and wrappers that hold the
  objects stay valid; tensors that share a storage keep sharing it.
- A DTensor's local shard becomes real (DTensor.from_local with the same
  mesh and placements); a module wrapped by FSDP2 (fully_shard) goes
  through its own to_empty, which FSDP2 supports.
- Real tensors of a partly meta model are not touched, unless describe()
  described them (`TensorDesc.real`: the init code writes all of it, so
  they are replaced like meta ones).

Or `Targets.adopt(views)` points the module at tensors that already hold
the values (zero-copy exports).
"""

import sys

import torch

from materializer.capture.walk import walk
from materializer.errors import LoadError


def _is_fsdp(model):
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None) if fsdp else None
    return cls is not None and any(isinstance(m, cls) for m in model.modules())


class Targets:
    """The meta groups of `model` that `spec` describes (by root name), and
    the real ones it says describe() described."""

    def __init__(self, model, spec):
        self.model = model
        self.spec = spec
        groups = walk(model)
        self.groups = {}
        by_name = {n: g for g in groups for n in g.names}
        for desc in spec.roots:
            g = by_name.get(desc.name)
            if g is None:
                raise LoadError(f"the spec names {desc.name}, which the module does not have")
            if not g.is_meta and (g.dtensor or not desc.real):
                raise LoadError(f"{desc.name} is not on the meta device any more "
                                "(was the model materialized already?)")
            if tuple(g.tensor.shape) != desc.shape or g.tensor.dtype != desc.dtype:
                raise LoadError(f"{desc.name}: the module holds {list(g.tensor.shape)} "
                                f"{g.tensor.dtype}, the spec {list(desc.shape)} {desc.dtype}")
            self.groups[desc.name] = g

    @property
    def managed(self):
        """True when a wrapper (FSDP2) owns the storage of the parameters:
        their values must be written into the storage it allocates, not
        swapped for other tensors."""
        return any(g.dtensor for g in self.groups.values()) and _is_fsdp(self.model)

    def allocate(self, device):
        """Makes every described tensor real on `device` (uninitialized);
        returns {root name: the tensor to fill} (a DTensor's local shard)."""
        device = torch.device(device)
        if self.managed:
            if not all(g.is_meta for g in walk(self.model)):
                raise LoadError("an FSDP2 module is materialized with its own to_empty, "
                                "which needs every tensor on the meta device")
            self.model.to_empty(device=device)
            return self._current()
        dests = self.new_tensors(device)
        self.install(dests)
        return dests

    def new_tensors(self, device):
        """{root name: a new uninitialized tensor of its local shape} on
        `device`, not yet in the module (install() puts them there)."""
        return {name: torch.empty(self.spec[name].local_shape, dtype=self.spec[name].dtype,
                                  device=device)
                for name in self.groups}

    def install(self, dests):
        """Puts `dests` (from new_tensors) into the module, in place."""
        for name, g in self.groups.items():
            self._install(g, dests[name])

    def adopt(self, views):
        """Points the module at `views` ({root name: tensor holding the
        values, of the local shape}) without copying."""
        for name, g in self.groups.items():
            self._install(g, views[name])

    def _current(self):
        out = {}
        for name, g in self.groups.items():
            t = g.root_slot.get()
            out[name] = t._local_tensor if hasattr(t, "_local_tensor") else t.data
        return out

    def _install(self, g, local):
        if g.dtensor:
            from torch.distributed.tensor import DTensor
            old = g.tensor
            value = DTensor.from_local(local, old.device_mesh, old.placements,
                                       run_check=False, shape=old.shape,
                                       stride=old.stride())
        else:
            value = local
        first = g.root_slot.get()
        if isinstance(first, torch.nn.Parameter):
            # Keep the Parameter objects (ties, optimizers and wrappers hold
            # them): swap in the real tensor's contents.
            done = set()
            for s in g.slots:
                p = s.get()
                if id(p) in done or not isinstance(p, torch.nn.Parameter):
                    continue
                done.add(id(p))
                if g.dtensor and value.device == p.device and torch._has_compatible_shallow_copy_type(p, value):
                    p.data = value
                    continue
                fresh = torch.nn.Parameter(value, requires_grad=p.requires_grad)
                try:
                    torch.utils.swap_tensors(p, fresh)
                except RuntimeError:
                    # swap_tensors refuses a Parameter that something holds
                    # a weak reference to (a meta tensor's .data cannot
                    # become a CPU tensor either): the new Parameter takes
                    # its place under every name that held it.
                    for other in g.slots:
                        if other.get() is p:
                            other.set(fresh)
            for s in g.slots:
                if s.kind == "buffer":
                    s.set(value)
            return
        for s in g.slots:
            s.set(value)


def check_loaded(model):
    """Names of tensors still on the meta device."""
    return [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
            if (t._local_tensor if hasattr(t, "_local_tensor") else t).device.type == "meta"]
