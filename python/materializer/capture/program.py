"""What is known about the values of one tensor: its init program.

Every meta tensor the recorder sees (a model parameter or buffer, or a
temporary made in init code) has an `Entry`: its base geometry and the
steps written into it so far, in call order. A step is a scheme over a
region (None: the whole tensor), or an *unknown* step that records why
the values there cannot be described (an op the recorder cannot express,
memory from torch.empty). A later step drops the earlier steps that lie
inside its region, so the program a spec carries is the one that decides
the values: `normal_` then `w[pad].zero_()` is two steps; `kaiming_uniform_`
then `normal_` is one.

Values derived from a draw (`torch.exp(torch.rand(n) * c)`) are a `Trace`:
the draw and the elementwise ops applied to it so far, from which each
value's program (a `map` scheme) is cut.

Entries can also be *evaluated*: where every step that covers a region is
a fill or computed scheme (zeros, constant, values, arange, ...), its values
are computed here on the CPU, which is how values made by elementwise math
on such tensors (RoPE tables, sinusoids, `torch.ones(n) * c`) are known.
"""

import math

import torch

from materializer.capture import regions
from materializer.capture.schemes import Scheme, rope_reference


class Step:
    __slots__ = ("scheme", "region", "reason")

    def __init__(self, scheme, region, reason=None):
        self.scheme = scheme   # None for an unknown step
        self.region = region
        self.reason = reason

    @property
    def known(self):
        return self.scheme is not None

    def __repr__(self):
        where = "" if self.region is None else f" @ {list(self.region)}"
        what = repr(self.scheme) if self.known else f"unknown({self.reason})"
        return what + where


class Unknown(Exception):
    """The values asked for cannot be computed here; str() says why."""


class Trace:
    """One draw and the elementwise ops applied to values made from it, in
    call order (not thread-safe; one recorder owns it).

    Value 0 is the draw (`leaf`, a random Scheme over `shape`, in the
    compute dtype `dtype`); op k (a dict as in a map scheme) makes value
    k + 1. `folded[k]` is value k as one normal/uniform scheme when only
    scalar affine ops led to it (`torch.randn(n) * 0.02` is normal(0,
    0.02)); the chain itself is kept for the ops that are not affine.
    """

    def __init__(self, leaf, dtype, shape):
        self.leaf = Scheme(leaf.kind, leaf.params)
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.ops = []
        self.folded = {0: self.leaf} if leaf.kind in ("normal", "uniform") else {}

    def add(self, op, folded=None):
        """Appends `op`; returns the index of the value it makes."""
        self.ops.append(dict(op))
        index = len(self.ops)
        if folded is not None:
            self.folded[index] = folded
        return index

    def program(self, index):
        """The ops value `index` needs, renumbered, in call order."""
        needed = {index}
        for k in range(index, 0, -1):
            if k in needed:
                op = self.ops[k - 1]
                needed.add(op["x"])
                if "y" in op:
                    needed.add(op["y"])
        kept = [k for k in range(1, index + 1) if k in needed]
        number = {0: 0}
        out = []
        for k in kept:
            op = dict(self.ops[k - 1])
            op["x"] = number[op["x"]]
            if "y" in op:
                op["y"] = number[op["y"]]
            out.append(op)
            number[k] = len(out)
        return out

    def scheme(self, index):
        """Value `index` as a scheme (with this trace as its origin): the
        folded scheme when there is one, else the draw's map."""
        origin = (self, index)
        if index == 0:
            return self.leaf.with_origin(origin)
        folded = self.folded.get(index)
        if folded is not None:
            return folded.with_origin(origin)
        return Scheme("map", {"init": self.leaf, "dtype": self.dtype,
                              "ops": self.program(index)}, origin)


class Entry:
    """The init program of one storage (not thread-safe; one recorder
    owns it)."""

    def __init__(self, base, origin):
        self.base = base           # a contiguous meta tensor over the storage
        self.origin = origin       # how it was made, for messages
        self.steps = []
        self.name = None           # the model's name for it, if any

    @property
    def shape(self):
        return tuple(int(s) for s in self.base.shape)

    @property
    def dtype(self):
        return self.base.dtype

    def write(self, scheme, region, reason=None):
        """Appends a step; earlier steps inside `region` no longer matter."""
        shape = self.shape
        if region is not None and any(l == 0 for _, l in region):
            return
        if math.prod(shape) == 0:
            region = None
        self.steps = [s for s in self.steps
                      if not regions.contains(region, s.region, shape)]
        self.steps.append(Step(scheme, region, reason))

    def unknown(self, region, reason):
        self.write(None, region, reason)

    def steps_over(self, region):
        """The steps that touch `region`, in order."""
        shape = self.shape
        return [s for s in self.steps
                if regions.intersect(s.region, region, shape) != "empty"]

    def single_step(self, region):
        """The one step whose values fill `region` exactly (the latest step
        that covers it, with nothing after it touching it), or None."""
        shape = self.shape
        touching = self.steps_over(region)
        if not touching:
            return None
        last = touching[-1]
        if last.region == region or (regions.contains(last.region, region, shape)
                                     and regions.contains(region, last.region, shape)):
            return last
        return None

    def evaluate(self, region, limit):
        """The values of `region` (a CPU tensor of the region's shape), if
        every step that decides them is computable. Raises Unknown."""
        shape = self.shape
        box = tuple((0, s) for s in shape) if region is None else region
        n = math.prod(l for _, l in box)
        if n > limit:
            raise Unknown(f"{n:,} elements are more than the {limit:,} this "
                          "process computes values for")
        out = None
        for step in self.steps:
            inter = regions.intersect(step.region, region, shape)
            if inter == "empty":
                continue
            if not step.known:
                raise Unknown(step.reason)
            if step.scheme.random:
                raise Unknown(f"it holds random values ({step.scheme!r})")
            if out is None:
                if not regions.contains(step.region, region, shape):
                    raise Unknown("part of it was never written")
                out = torch.empty([l for _, l in box], dtype=self.dtype)
            values = step_values(step, self.dtype, shape)
            src = regions.slice_of(values, regions.relative(inter, step.region, shape))
            dst = regions.slice_of(out, regions.relative(inter, region, shape))
            dst.copy_(src)
        if out is None:
            raise Unknown(f"nothing wrote it ({self.origin})")
        return out


def step_values(step, dtype, full_shape):
    """The values a computable step writes over its own region."""
    scheme = step.scheme
    shape = full_shape if step.region is None else [l for _, l in step.region]
    kind, p = scheme.kind, scheme.params
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if kind == "ones":
        return torch.ones(shape, dtype=dtype)
    if kind == "constant":
        return torch.full(shape, p["val"], dtype=dtype)
    if kind == "values":
        return p["data"].to(dtype).reshape(shape)
    if kind == "arange":
        n = math.prod(shape)
        if dtype.is_floating_point:
            v = torch.arange(n, dtype=torch.float64) * p.get("step", 1.0) + p.get("start", 0.0)
        else:
            v = torch.arange(n, dtype=torch.int64) * int(p.get("step", 1)) + int(p.get("start", 0))
        return v.to(dtype).reshape(shape)
    if kind == "eye":
        return torch.nn.init.eye_(torch.empty(shape, dtype=dtype))
    if kind == "dirac":
        return torch.nn.init.dirac_(torch.empty(shape, dtype=dtype), p.get("groups", 1))
    if kind == "rope_inv_freq" and not p.get("scaling"):
        dim = p.get("dim", 2 * shape[0])
        return rope_reference(p.get("base", 10000.0), dim).to(dtype)
    raise Unknown(f"{scheme!r} is not computed here")
