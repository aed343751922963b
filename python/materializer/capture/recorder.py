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
  math), so a buffer filled with them carries the values, read through
  any view (`expand`, transposes, strided slices); random factories
  (`torch.randn`) stay symbolic, and a scalar affine map of them
  (`torch.randn(n) * 0.02`) stays a scheme (normal(0, 0.02)).
- Elementwise math on a draw (`exp`, `log`, `clamp`, `softplus`, `x ** c`,
  arithmetic with constants or with other values of the same draw) is
  kept as the exact chain of ops (a `Trace`), so a tensor written with it
  gets a `map` step: the draw and the program the server runs over it.
  `torch.norm_except_dim(v, 2, dim)` of a model tensor `v` (weight
  normalization's g) becomes `norm_of`.
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
from materializer.capture.program import Entry, Trace, Unknown
from materializer.capture.schemes import SHAPED, Scheme, recognize

INIT_NAMES = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_",
              "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_",
              "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_INIT_FUNCS = {getattr(torch.nn.init, n): n for n in INIT_NAMES}
_INIT_CODES = {f.__code__: n for f, n in _INIT_FUNCS.items()}
_INIT_SIGS = {n: inspect.signature(f) for f, n in _INIT_FUNCS.items()}

# In-place methods that change no element values. Those that change the
# tensor's geometry must run, or later shapes differ from torch's.
_NON_DATA = frozenset({"requires_grad_", "retain_grad", "share_memory_",
                       "rename_", "detach_", "pin_memory", "record_stream",
                       "t_", "transpose_", "swapaxes_", "swapdims_", "squeeze_",
                       "unsqueeze_", "as_strided_"})
# Calls that read a tensor's values back into Python: on a meta tensor
# whose values are known here they give those values, as on the CPU
# (`torch.Tensor(np.linspace(...)).tolist()` in a constructor).
_READBACK = frozenset({"tolist", "item", "__float__", "__int__", "__index__",
                       "__bool__", "numpy", "__array__"})
# In-place methods that give the tensor other memory: they run, and what
# the tensor holds afterwards is not known.
_RESIZE = frozenset({"resize_", "resize_as_", "set_"})
_RANDOM_FACTORIES = {"randn": ("normal", {"mean": 0.0, "std": 1.0}),
                     "randn_like": ("normal", {"mean": 0.0, "std": 1.0}),
                     "rand": ("uniform", {"a": 0.0, "b": 1.0}),
                     "rand_like": ("uniform", {"a": 0.0, "b": 1.0})}
# Random draws with no scheme: computed here from known inputs they would
# use this process's global generator, so the spec would hold values that
# change with every describe() and do not follow `seed`. They are unknown
# instead (a CaptureError naming the op; an override gives the tensor a
# scheme). torch.normal with tensor arguments is one (its factory form,
# numbers only, is the normal scheme).
_UNSEEDED_DRAWS = frozenset({
    "exponential_", "random_", "bernoulli_", "bernoulli", "log_normal_", "cauchy_",
    "geometric_", "randint", "randint_like", "randperm", "multinomial", "poisson",
    "binomial", "normal"})
_UNSEEDED_WHY = ("a random draw the service has no scheme for (computed here, its "
                 "values would not follow the seed)")
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

# Elementwise ops followed on values derived from a draw, by name (method,
# function, in-place and operator forms) -> ElementwiseOp kind.
_UNARY_OPS = {n: k for k in ("exp", "log", "expm1", "log1p", "sqrt", "reciprocal")
              for n in (k, k + "_")}
_UNARY_OPS.update({n: "neg" for n in ("neg", "neg_", "negative", "negative_", "__neg__")})
_BINARY_OPS = {n: k for k, names in {
    "add": ("add", "add_", "__add__", "__radd__", "__iadd__"),
    "sub": ("sub", "sub_", "__sub__", "__isub__", "subtract", "subtract_"),
    "mul": ("mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply", "multiply_"),
    "div": ("div", "div_", "__truediv__", "__itruediv__", "__div__", "__idiv__",
            "true_divide", "true_divide_", "divide", "divide_"),
    "pow": ("pow", "pow_", "__pow__", "__ipow__")}.items() for n in names}
_REVERSED = {"__rsub__": "sub", "rsub": "sub"}     # other - self
_RDIV = frozenset({"__rtruediv__", "__rdiv__"})    # other / self: torch runs reciprocal, mul
_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_",
                     "clamp_max", "clamp_max_"})
_ELEMENTWISE = frozenset(_UNARY_OPS) | frozenset(_BINARY_OPS) | frozenset(_REVERSED) \
    | _RDIV | _CLAMPS | {"softplus"}


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
    # An op overload (`torch.ops.aten.fill_.Scalar`) is named "fill_.Scalar";
    # its packet's name ("fill_") is the op's, as the method form's is.
    packet = getattr(func, "overloadpacket", None)
    if packet is not None:
        func = packet
    name = getattr(func, "__name__", None) or str(func)
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        prop = getattr(owner, "__name__", "")
        return f"{prop}.{name}"
    return name


def _is_dtensor(x):
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(x, dt.DTensor)


# Writes through a tensor's storage (`t.untyped_storage().copy_(...)`,
# `.fill_`, `[i] = v`, `.resize_`) are storage methods, which torch function
# modes never see: without these patches such a write would leave the
# tensor with its earlier steps, silently other values than torch gives.
# While a Recorder is active, UntypedStorage's writing methods check their
# storage: a tracked one gets an unknown step (describe() names the tensor
# and the method), a real model tensor's is left unchanged; any other
# storage runs as usual. (TypedStorage writes go through these, or through
# tensor indexing, which the mode sees.)
_STORAGE_WRITES = ("copy_", "fill_", "__setitem__", "resize_")
_active = []          # Recorders inside `with`, innermost last
# While patched: name -> UntypedStorage's own attribute, or None where the
# method is inherited (restored by deleting the patch).
_storage_methods = {}


def _storage_write(name):
    original = getattr(torch.UntypedStorage, name)

    def write(storage, *args, **kwargs):
        key = getattr(storage, "_cdata", None)
        for rec in reversed(_active):
            entry = rec.entries.get(key)
            if entry is not None:
                with _quiet():
                    entry.unknown(None, f"written through its storage "
                                        f"(torch.UntypedStorage.{name})")
                return None if name == "__setitem__" else storage
            if key in rec.protected:
                return None if name == "__setitem__" else storage
        return original(storage, *args, **kwargs)

    write.__name__ = name
    return write


def _patch_storage_writes():
    if _storage_methods:
        return
    for name in _STORAGE_WRITES:
        _storage_methods[name] = vars(torch.UntypedStorage).get(name)
        setattr(torch.UntypedStorage, name, _storage_write(name))


def _unpatch_storage_writes():
    for name, own in _storage_methods.items():
        if own is None:
            delattr(torch.UntypedStorage, name)
        else:
            setattr(torch.UntypedStorage, name, own)
    _storage_methods.clear()


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

    def __enter__(self):
        _patch_storage_writes()
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        # Frames of init functions hold views of model tensors; views keep
        # their base's TensorImpl referenced, which would stop loaders from
        # swapping the real tensor into the Parameter later.
        self._handled_frames.clear()
        _active.remove(self)
        if not _active:
            _unpatch_storage_writes()
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

    def _swap_arguments(self, args, kwargs):
        """(args, kwargs) with each DTensor whose local tensor has a proxy
        replaced by the proxy. Flat arguments (what nn.init and in-place
        methods get) are swapped directly; nested ones through tree_map,
        whose rebuild of the arguments, on every recorded call of a model
        with DTensors, was a quarter of describe()'s time."""
        flat = (not any(isinstance(a, (list, tuple, dict)) for a in args)
                and not any(isinstance(v, (list, tuple, dict)) for v in kwargs.values()))
        if not flat:
            return tree_map(self._swap_dtensors, (args, kwargs))
        swap = self._swap_dtensors
        return (tuple(swap(a) for a in args),
                {k: swap(v) for k, v in kwargs.items()} if kwargs else kwargs)

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
        try:
            box = regions.locate(x, e.base)
        except regions.NotABox:
            # expand, strided slices, diagonals: the same view of all of it.
            return self.view_in(x, e, e.evaluate(None, self.limit))
        vals = e.evaluate(box.region, self.limit)
        return box.view(vals)

    def view_in(self, x, entry, full):
        """`x` (a view of entry's storage, of any geometry) as the same view
        of `full`, a contiguous CPU tensor of entry's values."""
        base = entry.base
        if x.dtype.itemsize != base.dtype.itemsize:
            raise Unknown("a view with another element size than the tensor")
        offset = x.storage_offset() - base.storage_offset()
        last = offset + sum((n - 1) * st for n, st in zip(x.shape, x.stride()) if n > 0)
        if x.numel() and (offset < 0 or last >= base.numel()):
            raise Unknown("a view that reaches outside the tensor")
        src = full if full.dtype == x.dtype else full.view(x.dtype)
        return src.as_strided(tuple(x.shape), tuple(x.stride()), offset)

    # -- the mode ----------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.proxies:
            args, kwargs = self._swap_arguments(args, kwargs)
        init_name = _INIT_FUNCS.get(func) or _init_wrapper(func)
        if init_name is not None:
            with _quiet():
                done, result = self._init_call(init_name, args, kwargs)
            return result if done else func(*args, **kwargs)
        name = _name(func)
        if name.startswith("_foreach_") and name.endswith("_"):
            return self._foreach(func, name, args, kwargs)
        if self.track_new and func is torch.normal and _normal_factory(args, kwargs) \
                and kwargs.get("device") is None:
            # torch.normal(mean, std, size) with numbers ignores the device
            # context (it would draw on the CPU from the global generator):
            # made on the meta device, it is the scheme normal(mean, std).
            kwargs = dict(kwargs, device="meta")
        if name in _READBACK and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "meta":
            with _quiet():
                try:
                    values = self.values_of(args[0]) if self.entry_of(args[0]) else None
                except Unknown:
                    values = None
            if values is not None:   # known here: read as on the CPU
                return func(values, *args[1:], **kwargs)
        if name in _RESIZE:
            out = func(*args, **kwargs)
            with _quiet():
                entry = self.entry_of(args[0]) if args else None
                if entry is not None:
                    entry.unknown(None, f"torch.Tensor.{name} gave it other memory")
            return out
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
        if name.endswith("_") and not name.startswith("__") and name not in _NON_DATA:
            # Private in-place ops (`torch._foo_(t, ...)`) write their first
            # argument as the public ones do: recorded, or refused, never run
            # on the meta stand-in as if nothing had been written.
            return args[0]
        return None

    def _foreach(self, func, name, args, kwargs):
        """torch._foreach_<op>_(tensors, ...) is <op>_ on each tensor of the
        list, each list argument giving its element to its tensor: a model
        tensor among them is recorded as its own <op>_ would be. Before, the
        call ran on the meta stand-ins and wrote nothing that was recorded,
        so `_foreach_mul_(params, 0.5)` after an init left the unscaled
        values in the spec."""
        tensors = args[0] if args else kwargs.get("self")
        if not isinstance(tensors, (list, tuple)) or not any(
                self.entry_of(t) is not None for t in tensors):
            return func(*args, **kwargs)
        op = name[len("_foreach_"):]
        method = getattr(torch.Tensor, op, None)
        n = len(tensors)

        def nth(a, i):
            return a[i] if isinstance(a, (list, tuple)) and len(a) == n else a

        rest = args[1:] if args else ()
        kwargs = {k: v for k, v in kwargs.items() if k != "self"}
        for i, t in enumerate(tensors):
            if method is None:
                entry = self.entry_of(t)
                if entry is not None:
                    entry.unknown(None, f"torch.{name}: torch.Tensor has no {op} "
                                        "for the recorder to follow per tensor")
                continue
            self.__torch_function__(method, (type(t),), (t, *[nth(a, i) for a in rest]),
                                    {k: nth(v, i) for k, v in kwargs.items()})
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
        except Exception as e:  # noqa: BLE001 - every failure names the op
            why = str(e) if isinstance(e, Unknown) else \
                f"the recorder could not follow it ({type(e).__name__}: {e})"
            try:
                region = self.box_of(target, entry).region
            except Unknown:
                region = None
            entry.unknown(region, f"torch.Tensor.{name}: {why}")

    def _write(self, name, func, entry, target, args, kwargs):
        if name == "data.__set__":
            return self._copy(target, args[1], "assignment to .data")
        if name == "__setitem__":
            sub = target.__getitem__(args[1])
            if storage_key(sub) != storage_key(target):
                return self._compute_write(name, func, entry, target, args, kwargs)
            return self._copy(sub, args[2], "x[i] = value")
        draw = _draw_into(name, func, target, args, kwargs)
        try:
            box = self.box_of(target, entry)
        except Unknown as not_box:
            if name in ("normal_", "uniform_") or draw is not None:
                raise
            return self._compute_write(name, func, entry, target, args, kwargs, not_box)
        if box.numel == 0:
            return
        if draw is not None:
            return entry.write(draw, box.region)
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
        if name in _ELEMENTWISE:
            got = self._derive(name, args, kwargs)
            if got is not None:
                trace, index = got
                if trace.dtype != entry.dtype:
                    raise Unknown(f"an op in {entry.dtype} on values derived from a "
                                  f"{trace.dtype} draw")
                return entry.write(trace.scheme(index), box.region)
        return self._compute_write(name, func, entry, target, args, kwargs)

    def _copy(self, target, src, what):
        """Records `target <- src` (broadcast like copy_)."""
        entry = self.entry_of(target)
        if entry is None:  # a protected real tensor: nothing to record
            return
        try:
            box = self.box_of(target, entry)
        except Unknown as not_box:
            vals = src if not isinstance(src, torch.Tensor) else self._source_values(src, what)
            return self._strided_write(entry, target, lambda view: view.copy_(
                vals if isinstance(vals, torch.Tensor) else torch.tensor(vals)), not_box)
        if box.numel == 0:
            return
        if not isinstance(src, torch.Tensor):
            return entry.write(_constant(src), box.region)
        if src.device.type == "meta":
            src_entry = self.entry_of(src)
            if src_entry is None:
                raise Unknown(f"{what} from a meta tensor whose values are unknown")
            try:
                vals = self.values_of(src)
            except Unknown as why:
                derived = self._derived(src)
                if derived is not None:
                    return self._write_derived(entry, box, target, src, derived)
                src_box = self.box_of(src, src_entry)
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

    def _source_values(self, src, what):
        if src.device.type != "meta":
            return src.detach().cpu()
        try:
            return self.values_of(src)
        except Unknown as why:
            raise Unknown(f"{what} of values that are not known here ({why}) through "
                          "a view that is not a box of the tensor") from None

    def _strided_write(self, entry, target, write, not_box):
        """A write through a view that is not a box (`w[::2]`, an expand, a
        diagonal): done here on the tensor's values, which must be known
        where the view does not write."""
        n = math.prod(entry.shape)
        if n > self.limit:
            raise not_box
        try:
            current = entry.evaluate(None, self.limit)
        except Unknown as why:
            index = self.view_in(target, entry, torch.arange(n).reshape(entry.shape))
            if index.unique().numel() != n:
                raise Unknown(f"{not_box}; the rest of it is not known here ({why})") from None
            current = torch.zeros(entry.shape, dtype=entry.dtype)
        write(self.view_in(target, entry, current))
        entry.write(_literal(current), None)

    def _write_derived(self, entry, box, target, src, derived):
        """`target <- src` where src holds values derived from a draw."""
        trace, index = derived
        if not box.natural:
            raise Unknown("values derived from a draw copied through a transposed or "
                          "broadcast view")
        squeeze = [d for d in src.shape if d != 1], [d for d in target.shape if d != 1]
        if squeeze[0] != squeeze[1]:
            raise Unknown(f"values derived from a draw of shape {list(src.shape)} "
                          f"broadcast to {list(target.shape)}")
        if trace.leaf.kind in SHAPED and tuple(trace.shape) != tuple(box.shape):
            raise Unknown(f"{trace.leaf!r} drawn with shape {list(trace.shape)}, "
                          f"which its parameters depend on, written to a region of "
                          f"shape {list(box.shape)}")
        scheme = trace.scheme(index)
        if trace.dtype != entry.dtype:
            scheme = scheme.with_origin(None)   # later ops run in another dtype
        entry.write(scheme, box.region)

    # -- values derived from a draw ---------------------------------------------------
    def _derived(self, x):
        """(Trace, index) when `x` (a meta tensor) holds a draw or values
        derived from one, exactly over what it views; None when it does not.
        Raises Unknown for such values that cannot be followed."""
        if not isinstance(x, torch.Tensor) or x.device.type != "meta":
            return None
        e = self.entry_of(x)
        if e is None:
            return None
        try:
            box = self.box_of(x, e)
        except Unknown:
            return None
        step = e.single_step(box.region)
        if step is None or not step.known or not step.scheme.random:
            return None
        s = step.scheme
        if isinstance(s.origin, tuple) and isinstance(s.origin[0], Trace):
            trace, index = s.origin
        elif s.kind == "map":
            raise Unknown("elementwise ops on values derived from a draw after a cast "
                          "to another dtype")
        else:
            trace, index = Trace(s, e.dtype, box.shape), 0
            step.scheme = s.with_origin((trace, 0))
        if trace.dtype != e.dtype:
            raise Unknown(f"values derived from a {trace.dtype} draw, held as {e.dtype}")
        if not box.natural or math.prod(trace.shape) != box.numel:
            raise Unknown("elementwise ops on a transposed or broadcast view of values "
                          "derived from a draw")
        return trace, index

    def _constant_operand(self, v):
        if isinstance(v, bool) or v is None:
            raise Unknown(f"an operand {v!r}")
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, torch.Tensor):
            vals = self.values_of(v)
            if vals.numel() != 1 or vals.is_complex() or vals.dtype == torch.bool:
                raise Unknown("an operand whose values vary per element (a program "
                              "takes constants and values of the same draw)")
            return float(vals.reshape(-1)[0].item())
        raise Unknown(f"an operand of type {type(v).__name__}")

    def _derive(self, name, args, kwargs):
        """(Trace, index) of the value the elementwise op `name` makes when
        it reads values derived from a draw; None when it reads none (or
        is not such an op). Raises Unknown when it cannot be followed."""
        if name not in _ELEMENTWISE or not args or kwargs.get("out") is not None:
            return None
        x = args[0]
        if name in _UNARY_OPS or name == "softplus" or name in _CLAMPS:
            got = self._derived(x)
            if got is None:
                return None
            trace, i = got
            if name in _UNARY_OPS:
                if len(args) > 1 or any(k != "out" for k in kwargs):
                    raise Unknown(f"{name} with arguments")
                return trace, self._append(trace, {"kind": _UNARY_OPS[name], "x": i})
            if name == "softplus":
                beta = _arg(args, kwargs, 1, "beta", 1.0)
                threshold = _arg(args, kwargs, 2, "threshold", 20.0)
                if beta != 1 or threshold != 20:
                    raise Unknown("softplus with beta or threshold other than 1 and 20")
                return trace, self._append(trace, {"kind": "softplus", "x": i})
            if name.startswith("clamp_min"):
                lo, hi = _arg(args, kwargs, 1, "min", None), None
            elif name.startswith("clamp_max"):
                lo, hi = None, _arg(args, kwargs, 1, "max", None)
            else:
                lo, hi = _arg(args, kwargs, 1, "min", None), _arg(args, kwargs, 2, "max", None)
            op = {"kind": "clamp", "x": i}
            if lo is not None:
                op["min"] = self._constant_operand(lo)
            if hi is not None:
                op["max"] = self._constant_operand(hi)
            if lo is None and hi is None:
                raise Unknown(f"{name} without bounds")
            return trace, self._append(trace, op)
        # Binary: self op other (other op self for the reversed forms).
        other = _arg(args, kwargs, 1, "exponent" if "pow" in name else "other", None)
        if kwargs.get("alpha", 1) != 1 or kwargs.get("rounding_mode") is not None:
            raise Unknown(f"{name} with alpha or rounding_mode")
        dx = self._derived(x)
        dy = self._derived(other)
        if dx is None and dy is None:
            return None
        if dx is not None and dy is not None and dx[0] is not dy[0]:
            raise Unknown(f"{name} combines values of two different random draws")
        trace = (dx or dy)[0]
        if name in _RDIV:   # other / x: what torch's __rdiv__ runs
            if dx is None:
                return None
            r = self._append(trace, {"kind": "reciprocal", "x": dx[1]})
            if dy is not None:
                return trace, self._append(trace, {"kind": "mul", "x": r, "y": dy[1]})
            return trace, self._append(trace, {"kind": "mul", "x": r,
                                               "c": self._constant_operand(other)})
        kind = _REVERSED.get(name) or _BINARY_OPS[name]
        first, second = (other, x) if name in _REVERSED else (x, other)
        d1, d2 = (dy, dx) if name in _REVERSED else (dx, dy)
        if d1 is not None and d2 is not None:
            return trace, self._append(trace, {"kind": kind, "x": d1[1], "y": d2[1]})
        if d1 is not None:
            return trace, self._append(trace, {"kind": kind, "x": d1[1],
                                               "c": self._constant_operand(second)})
        c = self._constant_operand(first)
        if kind == "pow":
            raise Unknown("a constant to the power of values derived from a draw")
        op = {"kind": kind, "x": d2[1], "c": c}
        if kind in ("sub", "div"):
            op["constant_first"] = True
        return trace, self._append(trace, op)

    @staticmethod
    def _append(trace, op):
        """Adds `op` to the trace, with its affine fold when there is one."""
        folded = None
        f = trace.folded.get(op["x"])
        if f is not None and "y" not in op:
            affine = {"add": "add", "mul": "mul", "neg": "neg",
                      "sub": "__rsub__" if op.get("constant_first") else "sub",
                      "div": None if op.get("constant_first") else "div"}.get(op["kind"])
            if affine is not None:
                folded = fold_affine(f, affine, op.get("c"), 1, None)
        return trace.add(op, folded)

    def _compute_write(self, name, func, entry, target, args, kwargs, not_box=None):
        """Any other in-place op: computed here when every value it reads
        is known."""
        if name in _UNSEEDED_DRAWS:
            raise Unknown(_UNSEEDED_WHY)
        def sub_of(view):
            def sub(x):
                if x is target:
                    return view
                if isinstance(x, torch.Tensor) and x.device.type == "meta":
                    return self.values_of(x)
                if isinstance(x, torch.device) or (isinstance(x, str) and x == "meta"):
                    return torch.device("cpu")
                return x
            return sub

        if not_box is not None:
            def write(view):
                cargs, ckwargs = tree_map(sub_of(view), (args, kwargs))
                with torch.no_grad():
                    func(*cargs, **ckwargs)
            return self._strided_write(entry, target, write, not_box)
        box = self.box_of(target, entry)
        if kwargs.get("out") is target:
            # The call writes every element of `out`: its old values do not matter.
            current = torch.empty(box.shape, dtype=entry.dtype)
        else:
            current = entry.evaluate(box.region, self.limit)
        view = box.view(current)
        cargs, ckwargs = tree_map(sub_of(view), (args, kwargs))
        with torch.no_grad():
            func(*cargs, **ckwargs)
        entry.write(_literal(current), box.region)

    # -- new tensors -------------------------------------------------------------------
    def _track_outputs(self, name, func, args, kwargs, out):
        # Most calls return one tensor: no pytree walk for those.
        leaves = (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        outs = [o for o in leaves
                if isinstance(o, torch.Tensor) and o.device.type == "meta"
                and not _is_dtensor(o)]
        inputs = None
        for o in outs:
            key = storage_key(o)
            if key is None or key in self.entries:
                continue  # a view of something tracked (or untrackable)
            if inputs is None:
                inputs = [x for x in tree_flatten((args, kwargs))[0]
                          if isinstance(x, torch.Tensor)]
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
            except Exception as why:  # noqa: BLE001 - named where it is used
                e.unknown(None, f"{name}: the recorder could not follow it "
                                f"({type(why).__name__}: {why})")

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
        if func is torch.normal and _normal_factory(args, kwargs):
            mean = _arg(args, kwargs, 0, "mean", 0.0)
            std = _arg(args, kwargs, 1, "std", 1.0)
            return Scheme("normal", {"mean": float(mean), "std": float(std)}), None
        if name in ("new", "new_tensor"):
            return self._legacy_new(name, args, kwargs, o), None
        metas = [x for x in inputs if x.device.type == "meta"]
        if len(metas) == 1 and out is o and name in _IDENTITY:
            got = self._derived(metas[0])
            if got is not None:
                trace, index = got
                if o.numel() != math.prod(trace.shape):
                    raise Unknown("its shape differs from the draw's")
                if o.dtype == trace.dtype:
                    return trace.scheme(index), None
                if index == 0 and tuple(o.shape) == trace.shape:
                    return trace.leaf, None   # the draw, in another dtype
                raise Unknown(f"values derived from a draw cast from {trace.dtype} to {o.dtype}")
        if out is o and name in _ELEMENTWISE:
            got = self._derive(name, args, kwargs)
            if got is not None:
                trace, index = got
                if o.dtype != trace.dtype:
                    raise Unknown(f"it makes {o.dtype} from values derived from a "
                                  f"{trace.dtype} draw")
                if o.numel() != math.prod(trace.shape):
                    raise Unknown("it broadcasts values derived from a draw")
                return trace.scheme(index), None
        if name in _UNSEEDED_DRAWS:
            raise Unknown(_UNSEEDED_WHY)
        if name == "norm_except_dim" and metas:
            norm = self._norm_of(args, kwargs)
            if norm is not None:
                return norm, None
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


    def _legacy_new(self, name, args, kwargs, o):
        """`x.new(sizes)` (uninitialized), `x.new(data)`, `x.new_tensor(data)`:
        what they make does not depend on x's values."""
        rest = args[1:]
        if name == "new" and all(isinstance(a, int) and not isinstance(a, bool) for a in rest) \
                or (len(rest) == 1 and isinstance(rest[0], torch.Size)):
            if o.numel() == 0:
                return Scheme("zeros")
            raise Unknown("uninitialized memory (Tensor.new)")
        data = rest[0] if rest else kwargs.get("data")
        if isinstance(data, torch.Tensor):
            data = self.values_of(data)
        return _literal(torch.tensor(data, dtype=o.dtype).reshape(o.shape))

    def _norm_of(self, args, kwargs):
        """`torch.norm_except_dim(v, 2, dim)` of a tensor whose values are not
        known here: norm_of, when v is a whole tracked tensor; else None."""
        v = args[0]
        try:
            self.values_of(v)
            return None   # known values: computed as usual
        except Unknown:
            pass
        e = self.entry_of(v)
        if e is None:
            return None
        box = self.box_of(v, e)
        if not box.whole or tuple(v.shape) != e.shape or not v.is_contiguous():
            raise Unknown("norm_except_dim of a part or a view of a tensor")
        if _arg(args, kwargs, 1, "pow", 2) != 2:
            raise Unknown("norm_except_dim with a pow other than 2")
        dim = int(_arg(args, kwargs, 2, "dim", 0))
        # The source's program now: its norm is of these values.
        snapshot = ("norm_of", [(s.scheme, s.region, s.reason) for s in e.steps])
        return Scheme("norm_of", {"tensor": e.base, "dim": dim}, origin=snapshot)


# -- helpers ---------------------------------------------------------------------------

def _draw_into(name, func, target, args, kwargs):
    """The scheme of a random factory that writes `target` through out=
    (torch.rand(4, 8, out=w), torch.randn, torch.normal(mean, std, size)),
    as its plain factory form gives; None for any other call. Computed
    here instead, the values would come from this process's generator and
    not follow the seed. Unknown when the size differs from the tensor's
    (torch would resize it)."""
    if kwargs.get("out") is not target or not target.is_floating_point():
        return None
    if name in ("rand", "randn") and func in (torch.rand, torch.randn):
        size = kwargs.get("size", args)
        if len(size) == 1 and isinstance(size[0], (list, tuple)):
            size = size[0]
        kind, params = _RANDOM_FACTORIES[name]
        scheme = Scheme(kind, dict(params))
    elif func is torch.normal and _normal_factory(args, kwargs):
        size = _arg(args, kwargs, 2, "size", None)
        mean = _arg(args, kwargs, 0, "mean", 0.0)
        std = _arg(args, kwargs, 1, "std", 1.0)
        scheme = Scheme("normal", {"mean": float(mean), "std": float(std)})
    else:
        return None
    try:
        size = tuple(int(n) for n in size)
    except (TypeError, ValueError):
        raise Unknown(f"torch.{name} with out= and a size it cannot read ({size!r})")
    if size != tuple(target.shape):
        raise Unknown(f"torch.{name} of size {list(size)} into a tensor of shape "
                      f"{list(target.shape)} (torch would resize it)")
    return scheme


def _normal_factory(args, kwargs):
    """torch.normal(mean, std, size) with numbers (a factory), not the
    form that draws around tensors of means or stds."""
    mean = _arg(args, kwargs, 0, "mean", None)
    std = _arg(args, kwargs, 1, "std", None)
    size = _arg(args, kwargs, 2, "size", None)
    number = (int, float)
    return (isinstance(mean, number) and isinstance(std, number)
            and not isinstance(mean, bool) and size is not None)


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
