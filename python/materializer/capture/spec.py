"""A described model: what describe() returns and the service takes.

`Spec` holds one `TensorDesc` per name (state_dict order, non-persistent
buffers included) and turns into the protocol's ModelSpec. It can be saved
as the proto3 JSON of a MaterializeRequest (the file format of `matctl`
and of `python -m materializer plan`) and read back.
"""

import collections
import json
import math

import torch

from materializer._proto import pb
from materializer.capture.program import Step
from materializer.capture.schemes import Scheme, from_proto, map_from_proto

DTYPES = {
    "float32": torch.float32, "float64": torch.float64,
    "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "complex64": torch.complex64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
RNG = {"portable": pb.RNG_MODE_PORTABLE, "torch": pb.RNG_MODE_TORCH}


def dtype_name(dtype):
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"the service has no dtype {dtype}") from None


class TensorDesc:
    """One name of the model.

    shape: the full tensor's shape (for a shard too). steps: the init
    program (a list of Step; empty for a tie). tie_to: the root name for a
    tied name. shard: this process's box of the full tensor ((offset,
    length) per dim) or None. real: the module held a real (non-meta)
    tensor here that describe() found fully written by the init code, so
    loading replaces it (not part of the protocol form).
    """

    def __init__(self, name, shape, dtype, kind="parameter", persistent=True,
                 module_type="", tie_to=None, steps=(), shard=None,
                 requires_grad=False, real=False):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.kind = kind
        self.persistent = persistent
        self.module_type = module_type
        self.tie_to = tie_to
        self.steps = list(steps)
        self.shard = tuple(shard) if shard is not None else None
        self.requires_grad = requires_grad
        self.real = real

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def local_shape(self):
        return self.shape if self.shard is None else tuple(l for _, l in self.shard)

    @property
    def nbytes(self):
        """Bytes this process holds (the shard's, for a shard)."""
        return math.prod(self.local_shape) * self.dtype.itemsize

    def __repr__(self):
        if self.tie_to:
            return f"{self.name} {list(self.shape)} {dtype_name(self.dtype)} -> {self.tie_to}"
        return (f"{self.name} {list(self.shape)} {dtype_name(self.dtype)}: "
                + "; ".join(repr(s) for s in self.steps))

    def _wire_scheme(self, step):
        """The step's scheme as the server takes it: a constant that is not
        finite (a -inf mask buffer made with torch.full) is sent as literal
        values, which may hold infinities (constants may not)."""
        scheme = step.scheme
        if scheme.kind == "constant" and not math.isfinite(scheme.params["val"]):
            shape = list(self.shape) if step.region is None else [l for _, l in step.region]
            data = torch.full(shape, scheme.params["val"], dtype=self.dtype)
            return Scheme("values", {"data": data}).to_proto(self.dtype)
        return scheme.to_proto(self.dtype)

    def to_proto(self):
        t = pb.TensorSpec(name=self.name, shape=list(self.shape),
                          dtype=dtype_name(self.dtype), module_type=self.module_type)
        t.kind = pb.TENSOR_KIND_BUFFER if self.kind == "buffer" else pb.TENSOR_KIND_PARAMETER
        if self.kind == "buffer":
            t.persistent = self.persistent
        if self.tie_to:
            t.tie_to = self.tie_to
        elif (len(self.steps) == 1 and self.steps[0].region is None
              and self.steps[0].scheme.kind != "map"):
            t.init.CopyFrom(self._wire_scheme(self.steps[0]))
        else:
            for step in self.steps:
                s = t.init_steps.add()
                if step.scheme.kind == "map":
                    leaf, program = step.scheme.map_proto()
                    s.init.CopyFrom(leaf)
                    s.map.CopyFrom(program)
                else:
                    s.init.CopyFrom(self._wire_scheme(step))
                if step.region is not None:
                    for o, l in step.region:
                        s.region.add(offset=o, length=l)
        if self.shard is not None:
            for o, l in self.shard:
                t.shard.box.add(offset=o, length=l)
        return t


class Spec:
    """The described model. `tensors`: TensorDesc in order; `seed`, `rng`
    ("portable" or "torch"); `modules`: (name, type, padding_idx) of
    embeddings."""

    def __init__(self, tensors, seed=0, rng="portable", modules=()):
        self.tensors = list(tensors)
        self.seed = int(seed)
        if rng not in RNG:
            raise ValueError(f"rng must be one of {sorted(RNG)}, not {rng!r}")
        self.rng = rng
        self.modules = list(modules)
        self._by_name = {t.name: t for t in self.tensors}

    def __getitem__(self, name):
        return self._by_name[name]

    def __contains__(self, name):
        return name in self._by_name

    def __len__(self):
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors)

    @property
    def roots(self):
        return [t for t in self.tensors if not t.tie_to]

    @property
    def nbytes(self):
        """Bytes of this process's tensors, each storage once."""
        return sum(t.nbytes for t in self.roots)

    def split(self, max_bytes):
        """This spec as consecutive parts (Specs) of at most `max_bytes` of
        tensor bytes each, in the spec's order; a tensor larger than that
        makes a part of its own. A tie goes with its root, a module (the
        constructor facts of an embedding) with its tensors. Every tensor's
        values depend only on (seed, rng, its name and init), never on the
        other tensors of the request (docs/init.md), so materializing the
        parts one by one gives the bytes of the whole."""
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        # A norm_of reads its source's values: the two go in one part,
        # where the first of them comes.
        together = self._norm_groups()
        part_of, count, size = {}, 0, 0
        for t in self.roots:
            if t.name in part_of:
                continue
            members = together.get(t.name, [t])
            nbytes = sum(m.nbytes for m in members)
            if count == 0 or (size and size + nbytes > max_bytes):
                count, size = count + 1, 0
            for m in members:
                part_of[m.name] = count - 1
            size += nbytes
        if count <= 1:
            return [self]
        members = [[] for _ in range(count)]
        for t in self.tensors:
            # A tie to nothing (or a cycle) stays in the first part, where
            # the server names it.
            members[part_of.get(self._root(t).name, 0)].append(t)
        parts = []
        for tensors in members:
            owners = {t.name.rpartition(".")[0] for t in tensors}
            parts.append(Spec(tensors, seed=self.seed, rng=self.rng,
                              modules=[m for m in self.modules if m[0] in owners]))
        return parts

    def _norm_groups(self):
        """{root name: [roots]} for roots linked by norm_of (a norm and its
        source, through ties), in spec order; others are absent."""
        parent = {}

        def find(n):
            while parent.get(n, n) != n:
                n = parent[n]
            return n

        for t in self.roots:
            for s in t.steps:
                if s.scheme is not None and s.scheme.kind == "norm_of":
                    src = self._by_name.get(s.scheme.params["tensor"])
                    if src is not None:
                        a, b = find(t.name), find(self._root(src).name)
                        if a != b:
                            parent[a] = b
        if not parent:
            return {}
        groups = collections.defaultdict(list)
        for t in self.roots:
            groups[find(t.name)].append(t)
        return {t.name: g for g in groups.values() if len(g) > 1 for t in g}

    def _root(self, t):
        seen = set()
        while t.tie_to and t.tie_to in self._by_name and t.name not in seen:
            seen.add(t.name)
            t = self._by_name[t.tie_to]
        return t

    def by_dtype(self):
        out = collections.OrderedDict()
        for t in sorted(self.roots, key=lambda t: dtype_name(t.dtype)):
            n, b = out.get(dtype_name(t.dtype), (0, 0))
            out[dtype_name(t.dtype)] = (n + 1, b + t.nbytes)
        return out

    def to_proto(self):
        m = pb.ModelSpec(seed=self.seed, rng=RNG[self.rng])
        for t in self.tensors:
            m.tensors.append(t.to_proto())
        for name, type_, padding_idx in self.modules:
            mod = m.modules.add(name=name, type=type_)
            if padding_idx is not None:
                mod.padding_idx = padding_idx
        return m

    def request(self, placement=None, label="", exportable=False):
        req = pb.MaterializeRequest(model=self.to_proto(), label=label,
                                    exportable=exportable)
        if placement:
            req.placement.device = placement
        return req

    def to_json(self, placement=None, label=""):
        from google.protobuf import json_format
        return json_format.MessageToJson(self.request(placement, label), indent=1)

    def save(self, path, placement=None, label=""):
        """Writes the proto3 JSON of a MaterializeRequest (`matctl
        materialize PATH` takes it)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json(placement, label))
            f.write("\n")

    @classmethod
    def load(cls, path):
        """A Spec from a request file (MaterializeRequest, PlanRequest or a
        bare ModelSpec in proto3 JSON)."""
        from google.protobuf import json_format
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        model = data.get("model", data) if isinstance(data, dict) else data
        return cls.from_proto(json_format.ParseDict(model, pb.ModelSpec()))

    @classmethod
    def from_proto(cls, model):
        tensors = []
        for t in model.tensors:
            dtype = DTYPES.get(t.dtype)
            if dtype is None:
                raise ValueError(f"tensor {t.name}: unknown dtype {t.dtype!r}")
            steps = []
            if t.HasField("init"):
                steps.append(Step(_scheme(t.init, dtype, list(t.shape)), None))
            for s in t.init_steps:
                region = tuple((r.offset, r.length) for r in s.region) or None
                shape = [l for _, l in region] if region else list(t.shape)
                scheme = _scheme(s.init, dtype, shape)
                if s.HasField("map"):
                    scheme = map_from_proto(scheme, s.map, dtype)
                steps.append(Step(scheme, region))
            shard = None
            if t.shard.box:
                shard = tuple((r.offset, r.length) for r in t.shard.box)
            elif t.shard.HasField("split"):
                shard = _split_box(list(t.shape), t.shard.split)
            kind = "buffer" if t.kind == pb.TENSOR_KIND_BUFFER else "parameter"
            tensors.append(TensorDesc(
                t.name, t.shape, dtype, kind=kind,
                persistent=t.persistent if t.HasField("persistent") else True,
                module_type=t.module_type, tie_to=t.tie_to or None, steps=steps,
                shard=shard))
        rng = "torch" if model.rng == pb.RNG_MODE_TORCH else "portable"
        modules = [(m.name, m.type, m.padding_idx if m.HasField("padding_idx") else None)
                   for m in model.modules]
        return cls(tensors, seed=model.seed, rng=rng, modules=modules)

    def __repr__(self):
        return (f"Spec({len(self.tensors)} tensors, {self.nbytes:,} bytes, "
                f"seed={self.seed}, rng={self.rng})")

    def describe_steps(self):
        """One line per tensor: name, shape, dtype and its steps (or tie)."""
        return "\n".join(repr(t) for t in self.tensors)


def _scheme(msg, dtype, shape):
    if msg.WhichOneof("scheme") == "values":
        data = torch.frombuffer(bytearray(msg.values.data), dtype=torch.uint8)
        return Scheme("values", {"data": data.view(dtype).reshape(shape)})
    return from_proto(msg)


def _split_box(shape, split):
    size = shape[split.dim]
    part = -(-size // split.count) if split.count else size
    lo = min(size, part * split.index)
    hi = min(size, lo + part)
    return tuple((lo, hi - lo) if d == split.dim else (0, s) for d, s in enumerate(shape))
