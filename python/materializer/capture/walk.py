"""The tensors of a module: names, owners, ties, devices, shards.

A *group* is one storage of the model seen under one or more names: a
parameter, a buffer, or a tie (the same Parameter object under two names,
or two objects sharing one storage). Names are state_dict keys, in
state_dict order, non-persistent buffers included.
"""

import sys

import torch

from materializer.capture.recorder import storage_key


class Slot:
    """Where a name lives: module._parameters[attr] or module._buffers[attr]."""

    __slots__ = ("name", "module", "attr", "kind", "persistent", "position")

    def __init__(self, name, module, attr, kind, persistent, position=0):
        self.position = position   # index in state_dict order
        self.name = name
        self.module = module
        self.attr = attr
        self.kind = kind            # "parameter" | "buffer"
        self.persistent = persistent

    def get(self):
        table = self.module._parameters if self.kind == "parameter" else self.module._buffers
        return table[self.attr]

    def set(self, value):
        table = self.module._parameters if self.kind == "parameter" else self.module._buffers
        table[self.attr] = value


class Group:
    """One storage of the model under its names; `root` is the name the
    spec gives the storage, the others are ties to it."""

    def __init__(self, key, tensor):
        self.key = key
        self.tensor = tensor
        self.slots = []
        self.root = None

    @property
    def names(self):
        return [s.name for s in self.slots]

    @property
    def root_slot(self):
        return next(s for s in self.slots if s.name == self.root)

    @property
    def dtensor(self):
        return is_dtensor(self.tensor)

    @property
    def local(self):
        """The tensor that holds this process's data (the local shard of a
        DTensor, else the tensor)."""
        return self.tensor._local_tensor if self.dtensor else self.tensor

    @property
    def is_meta(self):
        return self.local.device.type == "meta"

    @property
    def owner_class(self):
        return type(self.root_slot.module).__name__


def is_dtensor(x):
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(x, dt.DTensor)


def walk(model, tie_roots=()):
    """[Group] in state_dict order of their first name; `slots_in_order`
    (a module-level helper) gives every name in state_dict order."""
    groups = {}
    order = []
    seen = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        for kind, table in (("parameter", module._parameters), ("buffer", module._buffers)):
            for attr, t in table.items():
                if t is None:
                    continue
                persistent = kind == "parameter" or attr not in module._non_persistent_buffers_set
                slot = Slot(dot + attr, module, attr, kind, persistent, len(seen))
                seen.append(slot)
                key = storage_key(t._local_tensor if is_dtensor(t) else t)
                if key is None:
                    key = ("object", id(t))
                g = groups.get(key)
                if g is None:
                    g = groups[key] = Group(key, t)
                    order.append(g)
                elif g.tensor is not t and (tuple(g.tensor.shape) != tuple(t.shape)
                                            or g.tensor.dtype != t.dtype):
                    raise ValueError(
                        f"{slot.name} and {g.slots[0].name} share storage with "
                        "different shapes or dtypes (views of one tensor); the "
                        "service holds each name as a whole tensor or a tie")
                g.slots.append(slot)
    roots = set(tie_roots)
    for g in order:
        names = g.names
        g.root = next((n for n in names if n in roots), names[0])
    return order


def post_order(model):
    """Unique submodules, children before their parent (nn.Module.apply's
    order, and the order constructors run reset_parameters in)."""
    seen = set()
    out = []

    def visit(m):
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m.children():
            visit(child)
        out.append(m)

    visit(model)
    return out


def slots_in_order(groups):
    """(slot, group) for every name, in state_dict order."""
    return sorted(((s, g) for g in groups for s in g.slots), key=lambda p: p[0].position)
