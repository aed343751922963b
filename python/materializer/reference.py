"""The service's torch-mode init, in this process (docs/init.md).

`init_tensor(t, steps, seed, name)` writes what a server in RNG_MODE_TORCH
writes into a tensor with those steps (docs/init.md, "Init steps"): one
generator per tensor, seeded with derive_seed(seed, name), used by its
steps in order, each step the torch.nn.init call of its scheme on the
view of the step's region. Tests compare
materialized bytes with it, and the benchmark uses it as the in-process
baseline ("to_empty + the same init").

Derived values: a `map` step draws its leaf into a tensor of the region's
shape in the program's compute dtype, runs each op as the ATen call
`run_op` names (`torch.mul(x, c)`, `torch.rsub(x, c)` for `c - x`,
`torch.clamp(x, min, max)`, `torch.nn.functional.softplus(x)`, ...), and
copies the last value into the region. `norm_of` is
`torch.norm_except_dim(source, 2, dim)` of the source tensor's final
values (init_spec fills sources first).
"""

import torch

from materializer.capture import regions
from materializer.capture.schemes import rope_reference

MASK64 = (1 << 64) - 1
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(seed, name):
    return splitmix64((seed ^ splitmix64(fnv1a64(name.encode()))) & MASK64)


def _gain(value):
    if isinstance(value, str):
        return torch.nn.init.calculate_gain(value)
    return 1.0 if value is None else float(value)


def apply_scheme(t, scheme, g):
    """The torch.nn.init call of `scheme` on `t` with generator `g`."""
    init = torch.nn.init
    k, p = scheme.kind, scheme.params
    if t.numel() == 0:
        return
    if t.dtype in FLOAT8 and k not in ("values",):
        wide = torch.empty(t.shape, dtype=torch.float32, device=t.device)
        apply_scheme(wide, scheme, g)
        t.copy_(wide)
        return
    if k == "zeros" or k == "empty":
        init.zeros_(t)
    elif k == "ones":
        init.ones_(t)
    elif k == "constant":
        init.constant_(t, p["val"])
    elif k == "uniform":
        init.uniform_(t, p.get("a", 0.0), p.get("b", 1.0), generator=g)
    elif k == "normal":
        init.normal_(t, p.get("mean", 0.0), p.get("std", 1.0), generator=g)
    elif k == "trunc_normal":
        init.trunc_normal_(t, p.get("mean", 0.0), p.get("std", 1.0),
                           p.get("a", -2.0), p.get("b", 2.0), generator=g)
    elif k == "xavier_uniform":
        init.xavier_uniform_(t, gain=_gain(p.get("gain")), generator=g)
    elif k == "xavier_normal":
        init.xavier_normal_(t, gain=_gain(p.get("gain")), generator=g)
    elif k in ("kaiming_uniform", "kaiming_normal"):
        fn = init.kaiming_uniform_ if k == "kaiming_uniform" else init.kaiming_normal_
        fn(t, p.get("a", 0.0), p.get("mode") or "fan_in",
           p.get("nonlinearity") or "leaky_relu", generator=g)
    elif k == "orthogonal":
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            if t.dtype in (torch.float16, torch.bfloat16):
                wide = torch.empty(t.shape, dtype=torch.float32, device=t.device)
                init.orthogonal_(wide, gain=_gain(p.get("gain")), generator=g)
                t.copy_(wide)
            else:
                init.orthogonal_(t, gain=_gain(p.get("gain")), generator=g)
        finally:
            torch.set_num_threads(threads)
    elif k == "eye":
        init.eye_(t)
    elif k == "dirac":
        init.dirac_(t, p.get("groups", 1))
    elif k == "sparse":
        # Its permutations come from the global generator, which
        # init_tensor seeds once per tensor (docs/init.md).
        init.sparse_(t, p["sparsity"], p.get("std", 0.01), generator=g)
    elif k == "arange":
        n = t.numel()
        if t.dtype.is_floating_point:
            v = torch.arange(n, dtype=torch.float64) * p.get("step", 1.0) + p.get("start", 0.0)
        else:
            v = torch.arange(n, dtype=torch.int64) * int(p.get("step", 1)) + int(p.get("start", 0))
        t.copy_(v.to(t.dtype).reshape(t.shape))
    elif k == "rope_inv_freq":
        if p.get("scaling"):
            raise NotImplementedError("rope_inv_freq with scaling in the reference")
        dim = p.get("dim", 2 * t.shape[0])
        t.copy_(rope_reference(p.get("base", 10000.0), dim).to(t.dtype))
    elif k == "values":
        t.copy_(p["data"].reshape(t.shape).to(t.dtype))
    else:
        raise ValueError(f"no reference for scheme {k}")


def run_op(op, values):
    """One ElementwiseOp (a capture op dict) on earlier `values`: the ATen
    call of the Python code it stands for."""
    x = values[op["x"]]
    kind = op["kind"]
    if kind in ("add", "sub", "mul", "div", "pow"):
        other = values[op["y"]] if "y" in op else op["c"]
        if op.get("constant_first"):
            if kind == "sub":
                return torch.rsub(x, other)                  # c - x
            return torch.full_like(x, other).div_(x)          # c / x
        return getattr(torch, kind)(x, other)
    if kind == "clamp":
        return torch.clamp(x, min=op.get("min"), max=op.get("max"))
    if kind == "softplus":
        return torch.nn.functional.softplus(x)
    return getattr(torch, kind)(x)                            # neg, exp, log, ...


def apply_map(t, scheme, g):
    """A map step on `t` (the step's region)."""
    p = scheme.params
    leaf = torch.empty(t.shape, dtype=p["dtype"], device=t.device)
    apply_scheme(leaf, p["init"], g)
    values = [leaf]
    for op in p["ops"]:
        values.append(run_op(op, values))
    t.copy_(values[-1])


def init_tensor(t, steps, seed, name, sources=None):
    """Writes `steps` (capture Steps) into `t` as the service does in
    torch mode. sources: {name: final tensor} for norm_of steps."""
    d = derive_seed(seed, name)
    g = torch.Generator(device=t.device).manual_seed(d)
    if any(s.scheme.kind == "sparse" for s in steps):
        torch.manual_seed(d)
    with torch.no_grad():
        for step in steps:
            view = regions.slice_of(t, step.region)
            if step.scheme.kind == "map":
                apply_map(view, step.scheme, g)
            elif step.scheme.kind == "norm_of":
                p = step.scheme.params
                src = (sources or {})[p["tensor"]]
                view.copy_(torch.norm_except_dim(src, 2, p.get("dim", 0)).reshape(view.shape))
            else:
                apply_scheme(view, step.scheme, g)
    return t


def init_spec(tensors, spec):
    """init_tensor for every root of `spec` (tensors: name -> tensor), a
    norm's source before the norm."""
    roots = {d.name: d for d in spec.roots}

    def root(name):
        while spec[name].tie_to:
            name = spec[name].tie_to
        return name

    def reads(desc):
        return [root(s.scheme.params["tensor"]) for s in desc.steps
                if s.scheme.kind == "norm_of"]

    done = set()

    def fill(desc):
        if desc.name in done:
            return
        done.add(desc.name)
        for src in reads(desc):
            fill(roots[src])
        init_tensor(tensors[desc.name], desc.steps, spec.seed, desc.name,
                    sources={s.scheme.params["tensor"]: tensors[root(s.scheme.params["tensor"])]
                             for s in desc.steps if s.scheme.kind == "norm_of"})

    for desc in spec.roots:
        fill(desc)
    return tensors

