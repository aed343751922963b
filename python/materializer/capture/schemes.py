"""Init schemes as the capture layer holds them, and their protocol form.

A scheme is a `Scheme(kind, params)`: `kind` is the InitScheme oneof name
("normal", "kaiming_uniform", "values", ...) and `params` its fields in
proto form (`{"mean": 0.0, "std": 0.02}`). `values` carries a CPU tensor
(the literal elements, in the tensor's dtype) until the spec is built.

Two kinds are derived values (docs/init.md, "Derived values"):

- `Scheme("map", {"init": leaf, "dtype": torch.float32, "ops": [op, ...]})`:
  an elementwise program over what `leaf` (a Scheme: the draw) makes, in
  the compute dtype `dtype`. Each op is a dict in the fields of
  ElementwiseOp: `{"kind": "mul", "x": 0, "c": 4.6}` (`kind` the enum name
  in lower case; `x` an earlier value; `y` another earlier value or `c` a
  constant; `"constant_first": True` for `c - x`, `c / x`; `min`/`max` for
  clamp). Value 0 is the leaf's, op k makes value k + 1, the step writes
  the last one. It is a step of its own: InitStep(init=leaf, map=...).
- `Scheme("norm_of", {"tensor": name, "dim": d})`: the 2-norm of another
  tensor's final values over every dim but `d` (weight normalization's g).
  While recording, `tensor` is the source's meta tensor; describe() puts
  its name in.

The helpers (`normal(std=0.02)`, `zeros()`, ...) are what `overrides=`
takes, next to protocol InitScheme messages and their JSON mapping.
"""

import math

import torch

from materializer._proto import pb

# Schemes whose values depend on a random generator (the rest are fills or
# computed, so their values can be evaluated here).
RANDOM = frozenset({"uniform", "normal", "trunc_normal", "xavier_uniform",
                    "xavier_normal", "kaiming_uniform", "kaiming_normal",
                    "orthogonal", "sparse"})
# Schemes whose parameters depend on the tensor's shape (fans, rows).
SHAPED = frozenset({"xavier_uniform", "xavier_normal", "kaiming_uniform",
                    "kaiming_normal", "orthogonal", "sparse", "eye", "dirac"})
# ElementwiseOp kinds, in the enum's order (lower case).
OP_KINDS = ("add", "sub", "mul", "div", "pow", "neg", "exp", "log", "expm1",
            "log1p", "sqrt", "reciprocal", "clamp", "softplus")


class Scheme:
    """One init scheme with its parameters (immutable).

    `origin` is the recorder's note of where the values came from (the
    draw and the ops on it so far, or a norm's source as it was); it is
    not part of the scheme: equality and the protocol form ignore it."""

    __slots__ = ("kind", "params", "origin")

    def __init__(self, kind, params=None, origin=None):
        self.kind = kind
        self.params = dict(params or {})
        self.origin = origin

    def with_origin(self, origin):
        return Scheme(self.kind, self.params, origin)

    @property
    def random(self):
        """Whether the values depend on a draw (so they are not known here)."""
        return self.kind in RANDOM or self.kind == "map"

    def __repr__(self):
        if self.kind == "values":
            t = self.params["data"]
            return f"values({t.numel()} x {str(t.dtype).replace('torch.', '')})"
        if self.kind == "map":
            p = self.params
            ops = ", ".join(describe_op(k + 1, op) for k, op in enumerate(p["ops"]))
            dtype = str(p["dtype"]).replace("torch.", "")
            return f"map({p['init']!r} as {dtype}: {ops})"
        if self.kind == "norm_of":
            src = self.params["tensor"]
            src = "<tensor>" if isinstance(src, torch.Tensor) else src
            return f"norm_of({src}, dim={self.params.get('dim', 0)})"
        inner = ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items())
        return f"{self.kind}({inner})"

    def __eq__(self, other):
        if not isinstance(other, Scheme) or other.kind != self.kind:
            return False
        if self.kind == "values":
            a, b = self.params["data"], other.params["data"]
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return self.params == other.params

    def to_proto(self, dtype=None):
        """The InitScheme message. `values` become little-endian bytes of
        the tensor's dtype (`dtype`), as InitScheme.values wants."""
        msg = pb.InitScheme()
        if self.kind == "values":
            data = self.params["data"]
            if dtype is not None and data.dtype != dtype:
                data = data.to(dtype)
            raw = data.contiguous().reshape(-1)
            blob = raw.view(torch.uint8).numpy().tobytes() if raw.numel() else b""
            msg.values.data = blob
            return msg
        if self.kind == "map":
            raise ValueError("a map is a step of its own (InitStep.map): use map_proto()")
        if self.kind == "norm_of":
            src = self.params["tensor"]
            if not isinstance(src, str):
                raise ValueError("norm_of names its source tensor only once the spec is built")
            msg.norm_of.tensor = src
            msg.norm_of.dim = int(self.params.get("dim", 0))
            return msg
        sub = getattr(msg, self.kind)
        sub.SetInParent()
        for key, value in self.params.items():
            if key == "gain":
                if isinstance(value, str):
                    sub.gain.nonlinearity = value
                else:
                    sub.gain.value = float(value)
            elif key == "scaling":
                for sk, sv in value.items():
                    setattr(sub.scaling, sk, sv)
            else:
                setattr(sub, key, value)
        return msg


    def map_proto(self):
        """(InitScheme of the leaf, Elementwise) of a map (InitStep's init
        and map)."""
        from materializer.capture.spec import dtype_name
        p = self.params
        program = pb.Elementwise(dtype=dtype_name(p["dtype"]))
        for op in p["ops"]:
            m = program.ops.add(kind=OP_KINDS.index(op["kind"]) + 1, x=op["x"])
            if "y" in op:
                m.y = op["y"]
            elif "c" in op:
                m.c = float(op["c"])
            if op.get("constant_first"):
                m.constant_first = True
            if op.get("min") is not None:
                m.min = float(op["min"])
            if op.get("max") is not None:
                m.max = float(op["max"])
        return p["init"].to_proto(p["dtype"]), program


def map_from_proto(leaf, program, tensor_dtype):
    """The map Scheme of an InitStep (leaf: its init as a Scheme)."""
    from materializer.capture.spec import DTYPES
    dtype = DTYPES[program.dtype] if program.dtype else tensor_dtype
    ops = []
    for m in program.ops:
        op = {"kind": OP_KINDS[m.kind - 1], "x": m.x}
        which = m.WhichOneof("other")
        if which == "y":
            op["y"] = m.y
        elif which == "c":
            op["c"] = m.c
        if m.constant_first:
            op["constant_first"] = True
        if m.HasField("min"):
            op["min"] = m.min
        if m.HasField("max"):
            op["max"] = m.max
        ops.append(op)
    return Scheme("map", {"init": leaf, "dtype": dtype, "ops": ops})


_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}


def describe_op(index, op):
    """`v3 = v2 * 4.6`, `v5 = clamp(v4, min=0.0001)`: one op of a map."""
    x = f"v{op['x']}"
    kind = op["kind"]
    if kind in _SYMBOLS:
        other = f"v{op['y']}" if "y" in op else _fmt(float(op["c"]))
        a, b = (other, x) if op.get("constant_first") else (x, other)
        return f"v{index} = {a} {_SYMBOLS[kind]} {b}"
    if kind == "clamp":
        bounds = ", ".join(f"{k}={_fmt(float(op[k]))}" for k in ("min", "max")
                           if op.get(k) is not None)
        return f"v{index} = clamp({x}, {bounds})"
    return f"v{index} = {kind}({x})"


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


# -- helpers for overrides -----------------------------------------------------

def zeros():
    return Scheme("zeros")


def ones():
    return Scheme("ones")


def constant(val):
    return Scheme("constant", {"val": float(val)})


def uniform(a=0.0, b=1.0):
    return Scheme("uniform", {"a": float(a), "b": float(b)})


def normal(mean=0.0, std=1.0):
    return Scheme("normal", {"mean": float(mean), "std": float(std)})


def trunc_normal(mean=0.0, std=1.0, a=-2.0, b=2.0):
    return Scheme("trunc_normal", {"mean": float(mean), "std": float(std),
                                   "a": float(a), "b": float(b)})


def values(tensor):
    """Literal values (a CPU tensor of the target's shape)."""
    return Scheme("values", {"data": tensor.detach().cpu()})


def empty():
    """No init: for tensors the trainer overwrites itself."""
    return Scheme("empty")


_PROTO_FIELDS = None


def from_any(value):
    """A Scheme from what overrides accept: a Scheme, an InitScheme
    message, its JSON mapping ({"normal": {"std": 0.02}}), a number
    (constant), "zeros"/"ones"/"empty", or a tensor (literal values)."""
    if isinstance(value, Scheme):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool is not an init scheme")
    if isinstance(value, (int, float)):
        return constant(value)
    if isinstance(value, torch.Tensor):
        return values(value)
    if isinstance(value, str):
        if value in ("zeros", "ones", "empty"):
            return Scheme(value)
        raise ValueError(f"unknown scheme name {value!r} (use a dict such as "
                         "{'normal': {'std': 0.02}})")
    if isinstance(value, dict):
        from google.protobuf import json_format
        msg = json_format.ParseDict(value, pb.InitScheme())
        return from_proto(msg)
    if isinstance(value, pb.InitScheme):
        return from_proto(value)
    raise TypeError(f"cannot use {type(value).__name__} as an init scheme")


def from_proto(msg):
    kind = msg.WhichOneof("scheme")
    if kind is None:
        raise ValueError("an empty InitScheme")
    if kind == "values":
        raise ValueError("pass literal values as a tensor, not InitScheme.values")
    sub = getattr(msg, kind)
    if kind == "norm_of":
        return Scheme("norm_of", {"tensor": sub.tensor, "dim": int(sub.dim)})
    params = {}
    for field, value in sub.ListFields():
        if field.name == "gain":
            which = value.WhichOneof("kind")
            params["gain"] = value.nonlinearity if which == "nonlinearity" else value.value
        elif field.name == "scaling":
            params["scaling"] = {f.name: v for f, v in value.ListFields()}
        else:
            params[field.name] = value
    return Scheme(kind, params)


# -- recognizing computed values ---------------------------------------------------

def recognize(data):
    """A fill or computed scheme whose values equal `data` bit for bit, or
    None. Tried in order: one constant for every element, arange, RoPE
    inverse frequencies (default rotary, any base)."""
    flat = data.reshape(-1)
    n = flat.numel()
    if n == 0:
        return Scheme("zeros")
    first = flat[0]
    if data.is_complex():
        # Zeros or nothing: a complex tensor takes no computed scheme (and
        # ones or a constant would need a zero imaginary part).
        pairs = torch.view_as_real(flat)
        bits = pairs.view({4: torch.int32, 8: torch.int64}[pairs.element_size()])
        return Scheme("zeros") if not bool(bits.any()) else None
    if data.dtype == torch.bool:
        if bool((flat == first).all()):
            return Scheme("ones") if bool(first) else Scheme("zeros")
        return None
    if _same_bits(flat, first.expand(n)):
        v = first.item()
        if v == 0 and not (isinstance(v, float) and math.copysign(1.0, v) < 0):
            return Scheme("zeros")
        if v == 1:
            return Scheme("ones")
        if isinstance(v, float) and not math.isfinite(v):
            return None
        candidate = constant(v)
        if _same_bits(flat, torch.full((n,), float(v), dtype=data.dtype)):
            return candidate
        return None
    got = _arange(flat)
    if got is not None:
        return got
    return _rope(data)


def _same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        w = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(w), b.view(w))
    return torch.equal(a, b)


def _arange(flat):
    """arange(start, step) as the server computes it (docs/init.md), if
    it reproduces `flat` exactly."""
    n = flat.numel()
    if n < 2:
        return None
    dt = flat.dtype
    if dt.is_floating_point:
        start = flat[0].double().item()
        step = (flat[1].double() - flat[0].double()).item()
        if not (math.isfinite(start) and math.isfinite(step)):
            return None
        ref = (torch.arange(n, dtype=torch.float64) * step + start).to(dt)
    else:
        start = int(flat[0].item())
        step = int(flat[1].item()) - start
        ref = (torch.arange(n, dtype=torch.int64) * step + start).to(dt)
    if not _same_bits(flat, ref):
        return None
    params = {}
    if start != 0:
        params["start"] = float(start)
    if step != 1:
        params["step"] = float(step)
    return Scheme("arange", params)


def rope_reference(base, dim):
    """RoPE inverse frequencies, default rotary, in float32 (as the server's
    rope_inv_freq and Hugging Face compute them)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _rope(data):
    if data.dim() != 1 or not data.dtype.is_floating_point or data.numel() < 2:
        return None
    x = data.double()
    if x[0].item() != 1.0 or not (0 < x[1].item() < 1):
        return None
    n = data.numel()
    for dim in (2 * n, 2 * n - 1):
        if dim < 2:
            continue
        # inv_freq[1] = base^(-2/dim)
        guess = x[1].item() ** (-dim / 2.0)
        for base in _nice(guess):
            ref = rope_reference(base, dim).to(data.dtype)
            if _same_bits(data, ref):
                params = {"base": float(base)}
                if dim != 2 * n:
                    params["dim"] = dim
                return Scheme("rope_inv_freq", params)
    return None


def _nice(x):
    """Round candidates for a base recovered from float32 values."""
    out = []
    for digits in range(0, 7):
        scale = 10 ** (int(math.floor(math.log10(abs(x)))) - digits) if x > 0 else 1
        c = round(x / scale) * scale
        if c > 0 and c not in out:
            out.append(float(c))
    return out
