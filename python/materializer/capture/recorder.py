"""The recording mode: init calls on meta tensors become declarative steps.

`Recorder` is a TorchFunctionMode. While it is active, every torch call is
seen before it runs:

- An init call that writes a tracked meta tensor (a model tensor, or a
  temporary made under the recorder) is recorded as a step of that
  tensor's program and not run: every `torch.nn.init.*` function (seen as
  the call itself where torch lets modes see it, else recognized from the
  stack when its first write arrives), `.normal_`, `.uniform_`, `.zero_`,
  `.fill_`, `.copy_`, `x[i] = v`, through any view that is a box of the
  tensor (`.data`, `w[idx]`, `w[:, :k]`, `w.view(-1)`).
- Values computed from known values are computed here too, on the CPU
  (factories such as `torch.arange` on the meta device, then elementwise
  math), so a buffer filled with them carries the values; random
  factories (`torch.randn`) stay symbolic, and a scalar affine map of them
  (`torch.randn(n) * 0.02`) stays a scheme (normal(0, 0.02)).
- Anything else that writes a tracked tensor becomes an *unknown* step
  naming the op; describe() reports it unless a later step or an override
  covers it. Nothing is left uninitialized silently.

Writes to real (non-meta) tensors of the model are suppressed, so
describing a partly materialized model does not change it. Everything else
runs as usual (on meta tensors that is free).
"""

import inspect
import math
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from materializer.capture import regions
from materializer.capture.program import Entry, Unknown
from materializer.capture.schemes import Scheme, recognize

INIT_NAMES = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
              "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_",
              "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_INIT_FUNCS = {getattr(torch.nn.init, n): n for n in INIT_NAMES}
_INIT_CODES = {f.__code__: n for f, n in _INIT_FUNCS.items()}
_INIT_SIGS = {n: inspect.signature(f) for f, n in _INIT_FUNCS.items()}

# In-place methods that change no element values.
_NON_DATA = frozenset({"requires_grad_", "retain_grad", "share_memory_",
                       "rename_", "detach_", "pin_memory", "record_stream"})
_RANDOM_FACTORIES = {"randn": ("normal", {"mean": 0.0, "std": 1.0}),
                     "randn_like": ("normal", {"mean": 0.0, "std": 1.0}),
                     "rand": ("uniform", {"a": 0.0, "b": 1.0}),
                     "rand_like": ("uniform", {"a": 0.0, "b": 1.0})}
_EMPTY = frozenset({"empty", "empty_like", "new_empty", "empty_strided",
                    "new_empty_strided"})
_FILLS = {"zeros": 0, "zeros_like": 0, "new_zeros": 0,
          "ones": 1, "ones_like": 1, "new_ones": 1}
_FULLS = {"full", "full_like", "new_full"}
# Calls that return their input's values unchanged (a copy or a cast).
_IDENTITY = frozenset({"clone", "contiguous", "detach", "to", "float", "half",
                       "double", "bfloat16", "type_as", "__deepcopy__"})
_AFFINE_OPS = {
    "mul": "mul", "__mul__": "mul", "__rmul__": "mul", "mul_": "mul", "__imul__": "mul",
    "div": "div", "__truediv__": "div", "div_": "div", "__itruediv__": "div",
    "add": "add", "__add__": "add", "__radd__": "add", "add_": "add", "__iadd__": "add",
    "sub": "sub", "__sub__": "sub", "sub_": "sub", "__isub__": "sub", "__rsub__": "rsub",
    "neg": "neg", "__neg__": "neg", "neg_": "neg"}
_AFFINE = frozenset(_AFFINE_OPS)


_WRAPPERS = {}   # id(function) -> (function, init name or None)


def _init_wrapper(func):
    """The torch.nn.init name of a function that stands in for one.

    torch.nn.init's functions dispatch to modes under their *module-level*
    name, which libraries patch while they initialize (Hugging Face puts
    guarded wrappers with the same signature there), so the mode may see
    the wrapper instead of torch's function."""
    name = getattr(func, "__name__", None)
    if name not in _INIT_SIGS or getattr(func, "__self__", None) is not None:
        return None
    known = _WRAPPERS.get(id(func))
    if known is not None and known[0] is func:
        return known[1]
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        params = []
    result = name if params[:1] == ["tensor"] else None
    _WRAPPERS[id(func)] = (func, result)
    return result


def _quiet():
    """Our own bookkeeping runs without any torch function mode (no meta
    device context, no recorder): its tensors are CPU tensors."""
    return torch._C.DisableTorchFunction()


def storage_key(t):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _name(func):
    name = getattr(func, "__name__", None) or str(func)
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        prop = getattr(owner, "__name__", "")
        return f"{prop}.{name}"
    return name


def _is_dtensor(x):
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(x, dt.DTensor)


class Recorder(TorchFunctionMode):
    """See the module docstring. `entries` maps storage keys to Entries
    and is shared with the caller; `protected` holds storage keys of real
    model tensors (writes suppressed); `proxies` maps storage keys of
    DTensors' local tensors to global-shape meta proxies. `limit` is the
    most elements computed for one value on the CPU."""

    def __init__(self, entries, protected=(), proxies=None, limit=1 << 22,
                 track_new=True):
        super().__init__()
        self.entries = entries
        self.protected = set(protected)
        self.proxies = proxies or {}
        self.limit = limit
        self.track_new = track_new
        self._handled_frames = {}

    def __exit__(self, *exc):
        # Frames of init functions hold views of model tensors; views keep
        # their base's TensorImpl referenced, which would stop loaders from
        # swapping the real tensor into the Parameter later.
        self._handled_frames.clear()
        return super().__exit__(*exc)

    # -- lookups ---------------------------------------------------------------
    def entry_of(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != "meta" or _is_dtensor(t):
            return None
        return self.entries.get(storage_key(t))

    def _protected(self, t):
        return (isinstance(t, torch.Tensor) and t.device.type != "meta"
                and not _is_dtensor(t) and storage_key(t) in self.protected)

    def _swap_dtensors(self, x):
        if _is_dtensor(x):
            key = storage_key(x._local_tensor)
            proxy = self.proxies.get(key)
            if proxy is not None:
                return proxy
        return x

    def box_of(self, t, entry):
        try:
            return regions.locate(t, entry.base)
        except regions.NotABox as e:
            raise Unknown(f"written through a view that is not a box of it ({e})") from None

    def values_of(self, x):
        """A CPU tensor equal to `x` (meta and tracked, or real), or raises
        Unknown."""
        if not isinstance(x, torch.Tensor):
            return x
        if x.device.type != "meta":
            return x.detach().cpu() if x.device.type != "cpu" else x.detach()
        e = self.entry_of(x)
        if e is None:
            raise Unknown("a meta tensor whose values are unknown here")
        box = self.box_of(x, e)
        vals = e.evaluate(box.region, self.limit)
        return box.view(vals)

    # -- the mode ----------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.proxies:
            args, kwargs = tree_map(self._swap_dtensors, (args, kwargs))
        init_name = _INIT_FUNCS.get(func) or _init_wrapper(func)
        if init_name is not None:
            with _quiet():
                done, result = self._init_call(init_name, args, kwargs)
            return result if done else func(*args, **kwargs)
        name = _name(func)
        target = self._write_target(name, args, kwargs)
        if target is not None:
            with _quiet():
                entry = self.entry_of(target)
                if entry is not None:
                    if not self._inside_init_function(entry, target):
                        self._record_write(name, func, entry, target, args, kwargs)
                    return target if name not in ("__setitem__", "data.__set__") else None
                if self._protected(target):
                    return target if name not in ("__setitem__", "data.__set__") else None
        out = func(*args, **kwargs)
        if self.track_new:
            with _quiet():
                self._track_outputs(name, func, args, kwargs, out)
        return out

    def _write_target(self, name, args, kwargs):
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            return out
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        if name in ("__setitem__", "data.__set__"):
            return args[0]
        if "." in name:  # other property accessors (grad_fn, shape, ...)
            return None
        if name.startswith("__i") and name.endswith("__"):
            return args[0]
        if name.endswith("_") and not name.startswith("_") and name not in _NON_DATA:
            return args[0]
        return None

    # -- torch.nn.init -------------------------------------------------------------
    def _init_call(self, init_name, args, kwargs):
        """(True, tensor) when recorded or suppressed, (False, None) to run
        the call as usual."""
        bound = _INIT_SIGS[init_name].bind(*args, **kwargs)
        bound.apply_defaults()
        tensor = bound.arguments["tensor"]
        entry = self.entry_of(tensor)
        if entry is None:
            return (True, tensor) if self._protected(tensor) else (False, None)
        self._record_init(entry, tensor, init_name, bound.arguments)
        return True, tensor

    def _inside_init_function(self, entry, target):
        """True when the write comes from inside a torch.nn.init function
        that torch does not let modes see (xavier_*, trunc_normal_, ...):
        the function is recorded once, at its first write, and its own
        writes are not."""
        frame = sys._getframe(1)
        found = None
        while frame is not None:
            if frame in self._handled_frames:
                return True
            if frame.f_code in _INIT_CODES:
                found = frame
            frame = frame.f_back
        if found is None:
            return False
        init_name = _INIT_CODES[found.f_code]
        arguments = {p: found.f_locals.get(p)
                     for p in _INIT_SIGS[init_name].parameters}
        tensor = arguments["tensor"]
        owner = self.entry_of(tensor)
        if owner is None:
            return False
        self._handled_frames[found] = True
        self._record_init(owner, tensor, init_name, arguments)
        return True

    def _record_init(self, entry, tensor, init_name, a):
        try:
            box = self.box_of(tensor, entry)
            if box.numel == 0:
                return
            scheme = init_scheme(init_name, a, tuple(tensor.shape), box.shape)
        except Unknown as e:
            entry.unknown(None, f"torch.nn.init.{init_name}: {e}")
            return
        except (ValueError, TypeError) as e:
            raise type(e)(f"torch.nn.init.{init_name} on {entry.name or 'a tensor'}: {e}") from None
        entry.write(scheme, box.region)

    # -- writes ------------------------------------------------------------------------
    def _record_write(self, name, func, entry, target, args, kwargs):
        try:
            self._write(name, func, entry, target, args, kwargs)
        except Unknown as e:
            try:
                region = self.box_of(target, entry).region
            except Unknown:
                region = None
            entry.unknown(region, f"torch.Tensor.{name}: {e}")

    def _write(self, name, func, entry, target, args, kwargs):
        if name == "data.__set__":
            return self._copy(target, args[1], "assignment to .data")
        if name == "__setitem__":
            sub = target.__getitem__(args[1])
            if storage_key(sub) != storage_key(target):
                return self._compute_write(name, func, entry, target, args, kwargs)
            return self._copy(sub, args[2], "x[i] = value")
        box = self.box_of(target, entry)
        if box.numel == 0:
            return
        if name == "normal_":
            mean = _arg(args, kwargs, 1, "mean", 0.0)
            std = _arg(args, kwargs, 2, "std", 1.0)
            return entry.write(Scheme("normal", {"mean": float(mean), "std": float(std)}), box.region)
        if name == "uniform_":
            a = _arg(args, kwargs, 1, "from", 0.0)
            b = _arg(args, kwargs, 2, "to", 1.0)
            return entry.write(Scheme("uniform", {"a": float(a), "b": float(b)}), box.region)
        if name == "zero_":
            return entry.write(Scheme("zeros"), box.region)
        if name == "fill_":
            value = _scalar(self, _arg(args, kwargs, 1, "value", None))
            return entry.write(_constant(value), box.region)
        if name == "copy_":
            return self._copy(target, _arg(args, kwargs, 1, "src", None), "copy_")
        if name in _AFFINE and self._affine_write(name, entry, box, args, kwargs):
            return
        return self._compute_write(name, func, entry, target, args, kwargs)

    def _copy(self, target, src, what):
        """Records `target <- src` (broadcast like copy_)."""
        entry = self.entry_of(target)
        if entry is None:  # a protected real tensor: nothing to record
            return
        box = self.box_of(target, entry)
        if box.numel == 0:
            return
        if not isinstance(src, torch.Tensor):
            return entry.write(_constant(src), box.region)
        if src.device.type == "meta":
            src_entry = self.entry_of(src)
            if src_entry is None:
                raise Unknown(f"{what} from a meta tensor whose values are unknown")
            src_box = self.box_of(src, src_entry)
            try:
                vals = self.values_of(src)
            except Unknown as why:
                step = src_entry.single_step(src_box.region)
                if (step is not None and step.known and tuple(src.shape) == tuple(target.shape)):
                    return entry.write(step.scheme, box.region)
                if step is not None and not step.known:
                    raise Unknown(step.reason) from None
                raise Unknown(f"{what} from a value that is not known here ({why})") from None
        else:
            vals = src.detach()
        out = torch.empty(box.shape, dtype=entry.dtype)
        box.view(out).copy_(vals.cpu() if vals.device.type != "cpu" else vals)
        entry.write(_literal(out), box.region)

    def _affine_write(self, name, entry, box, args, kwargs):
        """`x op c` in place on a region that holds one random step."""
        step = entry.single_step(box.region)
        if step is None or not step.known or not step.scheme.random:
            return False
        if "rounding_mode" in kwargs:
            return False
        other = _arg(args, kwargs, 1, "other", None)
        alpha = kwargs.get("alpha", 1)
        folded = fold_affine(step.scheme, name, other, alpha, self)
        if folded is None:
            return False
        entry.write(folded, box.region)
        return True

    def _compute_write(self, name, func, entry, target, args, kwargs):
        """Any other in-place op: computed here when every value it reads
        is known."""
        box = self.box_of(target, entry)
        if kwargs.get("out") is target:
            # The call writes every element of `out`: its old values do not matter.
            current = torch.empty(box.shape, dtype=entry.dtype)
        else:
            current = entry.evaluate(box.region, self.limit)
        view = box.view(current)

        def sub(x):
            if x is target:
                return view
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                return self.values_of(x)
            if isinstance(x, torch.device) or (isinstance(x, str) and x == "meta"):
                return torch.device("cpu")
            return x

        cargs, ckwargs = tree_map(sub, (args, kwargs))
        with torch.no_grad():
            func(*cargs, **ckwargs)
        entry.write(_literal(current), box.region)

    # -- new tensors -------------------------------------------------------------------
    def _track_outputs(self, name, func, args, kwargs, out):
        outs = [o for o in tree_flatten(out)[0]
                if isinstance(o, torch.Tensor) and o.device.type == "meta"
                and not _is_dtensor(o)]
        if not outs:
            return
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        for o in outs:
            key = storage_key(o)
            if key is None or key in self.entries:
                continue  # a view of something tracked (or untrackable)
            if not o.is_contiguous():
                e = Entry(o, f"made by {name}")
                e.unknown(None, f"{name} made a non-contiguous meta tensor")
                self.entries[key] = e
                continue
            e = Entry(o, f"made by {name}")
            self.entries[key] = e
            try:
                e.write(*self._new_value(name, func, args, kwargs, inputs, o, out))
            except Unknown as why:
                e.unknown(None, f"{name}: {why}")

    def _new_value(self, name, func, args, kwargs, inputs, o, out):
        """(scheme, None) for a new meta tensor, or raises Unknown."""
        if name in _EMPTY:
            raise Unknown("uninitialized memory (torch.empty)")
        if name in _FILLS:
            return _constant(_FILLS[name]), None
        if name in _FULLS:
            value = _arg(args, kwargs, 1 if name != "new_full" else 2, "fill_value", None)
            return _constant(_scalar(self, value)), None
        if name in _RANDOM_FACTORIES:
            kind, params = _RANDOM_FACTORIES[name]
            return Scheme(kind, params), None
        metas = [x for x in inputs if x.device.type == "meta"]
        if len(metas) == 1 and out is o and name in (_IDENTITY | _AFFINE):
            src = metas[0]
            entry = self.entry_of(src)
            if entry is not None:
                step = entry.single_step(self.box_of(src, entry).region)
                if step is not None and step.known and step.scheme.random:
                    if name in _IDENTITY and tuple(src.shape) == tuple(o.shape):
                        return step.scheme, None
                    if name in _AFFINE and args and args[0] is src and "rounding_mode" not in kwargs:
                        folded = fold_affine(step.scheme, name, _arg(args, kwargs, 1, "other", None),
                                             kwargs.get("alpha", 1), self)
                        if folded is not None and tuple(src.shape) == tuple(o.shape):
                            return folded, None
        if o.numel() > self.limit:
            raise Unknown(f"{o.numel():,} elements are more than the {self.limit:,} "
                          "this process computes values for")
        # Compute the same call on the CPU with every meta input's values.
        def sub(x):
            if isinstance(x, torch.Tensor) and x.device.type == "meta":
                return self.values_of(x)
            if isinstance(x, torch.device) and x.type == "meta":
                return torch.device("cpu")
            if isinstance(x, str) and x == "meta":
                return "cpu"
            return x

        cargs, ckwargs = tree_map(sub, (args, kwargs))
        if "device" in ckwargs or (not metas and "device" not in kwargs):
            ckwargs["device"] = "cpu"
        try:
            with torch.no_grad():
                cout = func(*cargs, **ckwargs)
        except (RuntimeError, TypeError, ValueError) as e:
            raise Unknown(f"could not compute it here ({e})") from None
        flat_meta = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        flat_cpu = [x for x in tree_flatten(cout)[0] if isinstance(x, torch.Tensor)]
        for m, c in zip(flat_meta, flat_cpu):
            if m is o:
                if tuple(c.shape) != tuple(o.shape):
                    raise Unknown("its computed shape differs")
                return _literal(c.to(o.dtype).contiguous()), None
        raise Unknown("could not compute it here")


# -- helpers ---------------------------------------------------------------------------

def _arg(args, kwargs, i, key, default):
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


def _scalar(rec, v):
    if isinstance(v, torch.Tensor):
        vals = rec.values_of(v)
        if vals.numel() != 1:
            raise Unknown("a fill value with more than one element")
        return vals.reshape(-1)[0].item()
    if v is None:
        raise Unknown("no fill value")
    return v


def _constant(v):
    if isinstance(v, bool):
        return Scheme("ones") if v else Scheme("zeros")
    if isinstance(v, (int, float)):
        if v == 0 and math.copysign(1.0, float(v)) > 0:
            return Scheme("zeros")
        if v == 1:
            return Scheme("ones")
        return Scheme("constant", {"val": float(v)})
    raise Unknown(f"a fill value of type {type(v).__name__}")


def _literal(values):
    """A values step, or the fill / computed scheme it equals."""
    got = recognize(values)
    return got if got is not None else Scheme("values", {"data": values.detach().clone()})


def fold_affine(scheme, name, other, alpha, rec):
    """`random * c`, `random + c`, `c - random`, ... as one scheme (normal
    and uniform), or None."""
    if scheme.kind not in ("normal", "uniform"):
        return None
    op = _AFFINE_OPS.get(name)
    if op is None:
        return None
    if op == "neg":
        c = -1.0
        op = "mul"
    else:
        try:
            c = _scalar(rec, other)
        except Unknown:
            return None
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            return None
        c = float(c)
    p = scheme.params
    if op == "rsub":  # c - x
        neg = fold_affine(scheme, "neg", None, 1, rec)
        return fold_affine(neg, "add", c, 1, rec)
    if op in ("add", "sub"):
        c = c * float(alpha) * (-1.0 if op == "sub" else 1.0)
        if scheme.kind == "normal":
            return Scheme("normal", {"mean": p["mean"] + c, "std": p["std"]})
        return Scheme("uniform", {"a": p["a"] + c, "b": p["b"] + c})
    if op == "div":
        if c == 0:
            return None
        c = 1.0 / c
    if scheme.kind == "normal":
        return Scheme("normal", {"mean": p["mean"] * c, "std": abs(p["std"] * c)})
    lo, hi = sorted((p["a"] * c, p["b"] * c))
    return Scheme("uniform", {"a": lo, "b": hi})


def init_scheme(init_name, a, view_shape, box_shape):
    """The scheme a torch.nn.init call makes on a tensor of `view_shape`
    that is the region `box_shape` of its base. Fan-based schemes keep
    their name when the shapes agree, else become the uniform/normal with
    the bound torch computes from the view."""
    name = init_name[:-1]
    if name == "uniform":
        return Scheme("uniform", {"a": float(a["a"]), "b": float(a["b"])})
    if name == "normal":
        return Scheme("normal", {"mean": float(a["mean"]), "std": float(a["std"])})
    if name == "trunc_normal":
        return Scheme("trunc_normal", {k: float(a[k]) for k in ("mean", "std", "a", "b")})
    if name == "constant":
        return _constant(a["val"].item() if isinstance(a["val"], torch.Tensor) else a["val"])
    if name in ("ones", "zeros"):
        return Scheme(name)
    same = tuple(view_shape) == tuple(box_shape)
    if name in ("eye", "dirac", "orthogonal", "sparse") and not same:
        raise Unknown(f"{init_name} on a view of shape {list(view_shape)} "
                      f"whose region has shape {list(box_shape)}")
    if name == "eye":
        return Scheme("eye")
    if name == "dirac":
        return Scheme("dirac", {"groups": int(a["groups"])})
    if name == "orthogonal":
        return Scheme("orthogonal", {"gain": float(a["gain"])})
    if name == "sparse":
        return Scheme("sparse", {"sparsity": float(a["sparsity"]), "std": float(a["std"])})
    probe = torch.empty(view_shape, device="meta")
    if name.startswith("xavier"):
        gain = float(a["gain"])
        fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(probe)
        if same:
            return Scheme(name, {"gain": gain})
        std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    else:
        params = {"a": float(a["a"]), "mode": str(a["mode"]),
                  "nonlinearity": str(a["nonlinearity"])}
        fan = torch.nn.init._calculate_correct_fan(probe, params["mode"])
        gain = torch.nn.init.calculate_gain(params["nonlinearity"], params["a"])
        if same:
            return Scheme(name, params)
        std = gain / math.sqrt(fan)
    if name.endswith("uniform"):
        bound = math.sqrt(3.0) * std
        return Scheme("uniform", {"a": -bound, "b": bound})
    return Scheme("normal", {"mean": 0.0, "std": std})
