"""describe(model) -> Spec, and meta_device() for constructors.

The init of a meta module comes from its own code, recorded in the order a
normal (CPU) construction runs it:

1. values its constructor wrote (only when it was built under
   `meta_device()`, which records them; plain `torch.device("meta")` loses
   them);
2. `reset_parameters()` of every submodule that has one (children first,
   as constructors run them), with tied weights *untied*: each name's
   module initializes its own copy, and the storage keeps what the root
   name's module wrote, as when a model ties weights after building its
   modules;
3. the model's init hook (an `InitHook`; Hugging Face's runs untied too,
   since it initializes before it ties);
4. `overrides` ({glob: scheme}), last.

Each tensor's program is what its steps say after all of this; a tensor
that nothing initialized, or whose program holds an op the recorder cannot
express, is a CaptureError naming it, the op and its module class.
"""

import contextlib
import fnmatch
import inspect
import math
import threading

import torch

from materializer.capture import legacy, regions, schemes
from materializer.capture.program import Entry, Step, Unknown
from materializer.capture.recorder import Recorder, storage_key
from materializer.capture.spec import DTYPE_NAMES, Spec, TensorDesc, dtype_name
from materializer.capture.walk import post_order, slots_in_order, walk
from materializer.errors import CaptureError

# Elements one computed value may have (temporaries and constructor values
# whose values are computed on the CPU while recording).
COMPUTE_LIMIT = 1 << 24
# Literal values one tensor may carry to the server (bytes), and a whole
# spec (the server's limit per request, docs/api.md). Larger computed
# values need a scheme or an override.
MAX_LITERAL_BYTES = 64 << 20
MAX_TOTAL_LITERAL_BYTES = 128 << 20
# Init steps the server takes per tensor (docs/api.md).
MAX_STEPS = 1024


class InitHook:
    """The model's own init, run while recording.

    run: callable(model). untied: run it with tied weights untied (the
    model ties them itself afterwards, as Hugging Face does). tie_roots:
    names that own their tie group (the source of each tie). context: a
    context manager factory wrapped around run (e.g. to save and restore
    flags the hook sets). name: for messages.
    """

    def __init__(self, run, untied=False, tie_roots=(), context=None, name=None):
        self.run = run
        self.untied = untied
        self.tie_roots = tuple(tie_roots)
        self.context = context
        self.name = name or getattr(run, "__qualname__", "init hook")


def default_hook(model):
    """The init hook a plain module offers: `init_weights()` if it takes no
    argument, else `_init_weights(module)` applied to every submodule
    (children first), else None."""
    fn = getattr(model, "init_weights", None)
    if callable(fn) and _no_required_args(fn):
        return InitHook(lambda m: m.init_weights(), name=f"{type(model).__name__}.init_weights")
    fn = getattr(model, "_init_weights", None)
    if callable(fn):
        return InitHook(lambda m: m.apply(m._init_weights),
                        name=f"{type(model).__name__}._init_weights")
    return None


def _no_required_args(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(p.default is not inspect.Parameter.empty
               or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values())


# -- constructor values ----------------------------------------------------------

_registry_lock = threading.Lock()
_registry = {}   # storage key -> Entry, for storages made under meta_device()


def _prune_registry():
    """Forgets storages that only the registry still holds."""
    with _registry_lock:
        for key in [k for k, e in _registry.items()
                    if torch._C._storage_Use_Count(k) <= 1]:
            del _registry[key]


@contextlib.contextmanager
def meta_device(limit=COMPUTE_LIMIT):
    """A drop-in for `with torch.device("meta"):` that also records the
    values constructors write (a `logit_scale` made from a float, ones from
    `torch.ones`, RoPE tables computed on the meta device, `torch.randn(n) *
    0.02`), so that describe() keeps them, and makes the legacy
    constructors (`torch.Tensor(d, n)`, `torch.FloatTensor(4, 4)`, ...),
    which ignore torch.device("meta"), make meta tensors too
    (capture/legacy.py).

        with materializer.meta_device():
            model = MyModel(config)

    Use it from one thread at a time per model; the legacy constructors
    are patched for the duration (for the calling thread only) and
    restored on exit, also on exceptions.
    """
    with _registry_lock:
        entries = dict(_registry)
    rec = Recorder(entries, limit=limit)
    try:
        with torch.device("meta"), rec, legacy.patched():
            yield
    finally:
        with _registry_lock:
            _registry.update(entries)
        _prune_registry()


def _seed_entry(group, local_meta):
    """The Entry a model tensor starts from: its constructor's program when
    it was built under meta_device(), else empty."""
    key = storage_key(group.local) if not group.dtensor else None
    with _registry_lock:
        made = _registry.get(key) if key is not None else None
    entry = Entry(local_meta, f"{group.root} ({group.owner_class})")
    entry.name = group.root
    if made is None:
        return entry
    base = made.base
    if tuple(base.shape) == tuple(local_meta.shape) and base.storage_offset() == local_meta.storage_offset():
        entry.steps = list(made.steps)
    elif base.numel() == local_meta.numel() and base.storage_offset() == local_meta.storage_offset():
        entry.steps = [Step(s.scheme, None, s.reason) for s in made.steps if s.region is None][-1:]
    elif base.dtype != local_meta.dtype and _same_bytes(base, local_meta):
        # The same bytes read as another dtype (torch.view_as_complex of a
        # stacked (cos, sin) table, Tensor.view(dtype)): its values are
        # those bytes, when the constructor's are known here.
        try:
            values = made.evaluate(None, COMPUTE_LIMIT)
        except Unknown as why:
            entry.unknown(None, f"a view as {local_meta.dtype} of values not known "
                                f"here ({why})")
        else:
            data = values.contiguous().view(-1).view(torch.uint8).view(local_meta.dtype)
            entry.steps = [Step(schemes.recognize(data) or schemes.values(
                data.reshape(local_meta.shape).clone()), None)]
    # Copies: recording may note origins on steps; the registry's stay as made.
    entry.steps = [Step(s.scheme, s.region, s.reason) for s in entry.steps]
    return entry


def _same_bytes(a, b):
    """Whether `a` and `b` cover the same bytes of their storage."""
    return (a.numel() * a.element_size() == b.numel() * b.element_size()
            and a.storage_offset() * a.element_size() == b.storage_offset() * b.element_size())


# -- describe ----------------------------------------------------------------------

def describe(model, *, seed=0, rng="portable", init=None, overrides=None,
             reset_parameters=True, keep_real=False, limit=COMPUTE_LIMIT,
             max_literal_bytes=MAX_LITERAL_BYTES,
             max_total_literal_bytes=MAX_TOTAL_LITERAL_BYTES):
    """The Spec of `model`'s meta tensors (see the module docstring).

    init: an InitHook, a callable(model), None (the model's own:
      default_hook), or False (none).
    overrides: {glob: scheme} applied last; a scheme is a Scheme, an
      InitScheme message or its JSON mapping, a number (constant), or a
      tensor (literal values). A pattern that matches no name is an error.
    reset_parameters: run every submodule's reset_parameters() first.
    rng: "portable" (default; needed for shards) or "torch".
    keep_real: leave real (non-meta) tensors out of the spec, unchanged
      (a partly loaded model). By default a real tensor is recorded like a
      meta one (the init code runs on a meta stand-in): when the init code
      writes all of it, it is described and materialize() replaces it;
      otherwise it is a CaptureError (its values may be the uninitialized
      memory of a legacy constructor such as torch.Tensor(d, n)).
    """
    if init is None:
        hook = default_hook(model)
    elif init is False:
        hook = None
    elif isinstance(init, InitHook):
        hook = init
    elif callable(init):
        hook = InitHook(init)
    else:
        raise TypeError("init must be an InitHook, a callable, None or False")
    _prune_registry()
    groups = walk(model, hook.tie_roots if hook else ())
    if not any(g.is_meta for g in groups):
        raise CaptureError("the model has no tensor on the meta device: there "
                           "is nothing to materialize")
    real = [] if keep_real else [g for g in groups if not g.is_meta and not g.dtensor]
    meta = [g for g in groups if g.is_meta] + real
    entries = {}
    proxies = {}
    protected = set()
    by_key = {}
    stand_ins = {}
    for g in groups:
        if g in real:
            stand_in = torch.empty(tuple(g.tensor.shape), dtype=g.tensor.dtype, device="meta")
            entry = Entry(stand_in, f"{g.root} ({g.owner_class})")
            entry.name = g.root
            entries[storage_key(stand_in)] = entry
            by_key[g.key] = entry
            stand_ins[g.key] = stand_in
            continue
        if not g.is_meta:
            protected.add(g.key)
            continue
        if g.dtensor:
            proxy = torch.empty(tuple(g.tensor.shape), dtype=g.tensor.dtype, device="meta")
            proxies[g.key] = proxy
            entry = Entry(proxy, f"{g.root} ({g.owner_class})")
            entry.name = g.root
            entries[storage_key(proxy)] = entry
        else:
            if not g.local.is_contiguous():
                raise CaptureError(f"{g.root} ({g.owner_class}): a non-contiguous meta "
                                   "tensor; the service holds contiguous tensors")
            entry = _seed_entry(g, g.local)
            entries[g.key] = entry
        by_key[g.key] = entry
    before = {s.name: s.get() for g in groups for s in g.slots}
    # torch.utils.swap_tensors keeps the object and swaps what it holds:
    # a replacement too, which identity alone does not show.
    held_before = {n: _held(t) for n, t in before.items()}
    rec = Recorder(entries, protected=protected, proxies=proxies, limit=limit)
    with torch.no_grad(), _stood_in(real, stand_ins) as replaced:
        if reset_parameters:
            with _untied(meta), rec:
                for m in post_order(model):
                    _reset(m, rec, by_key, groups)
        if hook is not None:
            ctx = hook.context() if hook.context else contextlib.nullcontext()
            with ctx, (_untied(meta) if hook.untied else contextlib.nullcontext()), rec:
                try:
                    hook.run(model)
                except Exception as e:  # noqa: BLE001 - reported with the hook's name
                    raise CaptureError(f"{hook.name} raised {type(e).__name__} while "
                                       f"recording on the meta model: {e}") from e
    after = {s.name: s.get() for g in groups for s in g.slots}
    changed = [n for n in before if after.get(n) is not before[n]
               or _held(after.get(n)) != held_before[n]] + replaced
    if changed:
        raise CaptureError("the init code replaced tensors of the model instead of "
                           "writing into them: " + ", ".join(changed[:10]))
    _apply_overrides(overrides or {}, meta, by_key)
    return _spec(model, groups, by_key, {g.key for g in real}, seed, rng,
                 max_literal_bytes, max_total_literal_bytes)


def _held(t):
    """The storage a model tensor holds (its local tensor's, for a
    DTensor), or None."""
    if not isinstance(t, torch.Tensor):
        return None
    local = getattr(t, "_local_tensor", None)
    return storage_key(local if isinstance(local, torch.Tensor) else t)


@contextlib.contextmanager
def _stood_in(groups, stand_ins):
    """Puts a meta stand-in (sharing one storage per group) where each
    real tensor of `groups` is, for the duration; yields a list that names
    the slots the init code replaced meanwhile."""
    saved = []
    replaced = []
    for g in groups:
        made = {}
        for s in g.slots:
            orig = s.get()
            if id(orig) not in made:
                if isinstance(orig, torch.nn.Parameter):
                    made[id(orig)] = torch.nn.Parameter(stand_ins[g.key],
                                                        requires_grad=orig.requires_grad)
                else:
                    made[id(orig)] = stand_ins[g.key].detach()
            s.set(made[id(orig)])
            saved.append((s, orig, made[id(orig)]))
    try:
        yield replaced
    finally:
        for s, orig, stand_in in reversed(saved):
            if s.get() is not stand_in:
                replaced.append(s.name)
            s.set(orig)


def _reset(module, rec, by_key, groups):
    fn = getattr(module, "reset_parameters", None)
    if not (callable(fn) and _no_required_args(fn)):
        fn = getattr(module, "_reset_parameters", None)
        if not (callable(fn) and _no_required_args(fn)):
            return
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the module's tensors record it
        reason = (f"{type(module).__name__}.{fn.__name__}() raised "
                  f"{type(e).__name__} on the meta model: {e}")
        for g in groups:
            if g.key in by_key and any(s.module is module for s in g.slots):
                by_key[g.key].unknown(None, reason)


@contextlib.contextmanager
def _untied(groups):
    """Gives every non-root name of a tie its own meta tensor for the
    duration (what it initializes is dropped), then restores the tie."""
    saved = []
    for g in groups:
        if len(g.slots) < 2:
            continue
        root = g.root_slot
        done = {(id(root.module), root.attr)}
        for s in g.slots:
            where = (id(s.module), s.attr)
            if where in done:
                continue
            done.add(where)
            orig = s.get()
            dummy = torch.empty(tuple(orig.shape), dtype=orig.dtype, device="meta")
            if s.kind == "parameter":
                dummy = torch.nn.Parameter(dummy, requires_grad=orig.requires_grad)
            s.set(dummy)
            saved.append((s, orig))
    try:
        yield
    finally:
        for s, orig in reversed(saved):
            s.set(orig)


def _apply_overrides(overrides, groups, by_key):
    names = {}
    for g in groups:
        for n in g.names:
            names[n] = g
    missing = []
    for pattern, value in overrides.items():
        scheme = schemes.from_any(value)
        hits = {id(g): g for n, g in names.items() if fnmatch.fnmatchcase(n, pattern)}
        if not hits:
            missing.append(pattern)
            continue
        for g in hits.values():
            entry = by_key[g.key]
            if scheme.kind == "values":
                data = scheme.params["data"]
                if tuple(data.shape) != entry.shape and data.numel() != entry.base.numel():
                    raise CaptureError(f"override {pattern!r}: values of shape "
                                       f"{list(data.shape)} for {g.root} of shape "
                                       f"{list(entry.shape)}")
                scheme = schemes.Scheme("values", {"data": data.to(entry.dtype).reshape(entry.shape)})
            entry.steps = [Step(scheme, None)]
    if missing:
        known = sorted(names)
        sample = ", ".join(known[:5]) + (", ..." if len(known) > 5 else "")
        raise CaptureError(
            "overrides match no tensor on the meta device: "
            + ", ".join(repr(p) for p in missing)
            + f" (patterns are globs over full names such as {sample})")


def _incomplete(steps, shape):
    """Why a program does not write every element, or None."""
    if not steps:
        return "nothing writes it"
    bad = [s for s in steps if not s.known]
    if bad:
        return bad[0].reason
    if steps[0].region is not None and not regions.covers([s.region for s in steps], shape):
        return f"only part of it, from region {list(steps[0].region)}"
    return None


def _real_problem(g, why):
    return (f"{g.root} ({g.owner_class}): a real tensor on {g.tensor.device}, not meta, "
            f"that the init code does not write completely ({why}); its values may be "
            "uninitialized memory (a legacy constructor such as torch.Tensor(d, n) ignores "
            "the meta device): build the model under materializer.meta_device(), or pass "
            "keep_real=True to keep it as it is")


def _resolve_norms(groups, by_key, problems):
    """norm_of steps name their source's root; the norm must be of the
    source's final program (its values when the norm was taken)."""
    by_storage = {}
    for g in groups:
        if g.key in by_key:
            by_storage[storage_key(by_key[g.key].base)] = g
            by_storage[g.key] = g
    for g in groups:
        entry = by_key.get(g.key)
        if entry is None:
            continue
        for i, step in enumerate(entry.steps):
            if not step.known or step.scheme.kind != "norm_of":
                continue
            src = step.scheme.params["tensor"]
            if isinstance(src, str):
                continue
            where = f"{g.root} ({g.owner_class})"
            source = by_storage.get(storage_key(src))
            if source is None:
                problems.append(f"{where}: norm_except_dim of a tensor that is not one of "
                                "the model's")
                continue
            origin = step.scheme.origin
            then = origin[1] if isinstance(origin, tuple) and origin[0] == "norm_of" else None
            now = [(s.scheme, s.region, s.reason) for s in by_key[source.key].steps]
            if then is not None and then != now:
                problems.append(f"{where}: the norm of {source.root}, taken before the init "
                                f"code wrote {source.root} again (the server computes it "
                                "from the final values)")
                continue
            entry.steps[i] = Step(schemes.Scheme(
                "norm_of", {"tensor": source.root, "dim": step.scheme.params["dim"]}), step.region)


# What a complex tensor may hold (the server refuses the rest).
_COMPLEX_SCHEMES = ("zeros", "ones", "constant", "empty", "values")


def _spec(model, groups, by_key, real, seed, rng, max_literal, max_total):
    problems = []
    tensors = []
    literal_total = 0
    has_shards = False
    shards = {}
    boxes = {}   # (shape, mesh, placements) -> box: layers repeat their shapes
    _resolve_norms(groups, by_key, problems)
    for g in groups:
        if g.key not in by_key:
            continue
        entry = by_key[g.key]
        steps = entry.steps
        where = f"{g.root} ({g.owner_class})"
        if g.tensor.dtype not in DTYPE_NAMES:
            # Whatever the init code did, the service cannot hold it.
            problems.append(f"{where}: its dtype {g.tensor.dtype} is not one the "
                            "service holds (floating, integer and bool dtypes, and "
                            "complex64); give the model that tensor after materialize()")
            continue
        if g.tensor.dtype.is_complex:
            drawn = [s.scheme.kind for s in steps
                     if s.known and s.scheme.kind not in _COMPLEX_SCHEMES]
            if drawn:
                # torch draws a complex number's two parts with std / sqrt(2)
                # each; the service keeps complex tensors to values.
                problems.append(f"{where}: {drawn[0]} on a {g.tensor.dtype} tensor; complex "
                                "tensors take only values computed here (a rotary "
                                "table), zeros, ones or a constant")
                continue
        if math.prod(entry.shape) == 0:
            # No element, so nothing to initialize (or to leave unwritten).
            entry.steps = steps = [Step(schemes.empty(), None)]
        bad = [s for s in steps if not s.known]
        if g.key in real:
            why = _incomplete(steps, entry.shape)
            if why is not None:
                problems.append(_real_problem(g, why))
                continue
        if not steps:
            problems.append(f"{where}: nothing initializes it (no constructor value "
                            "recorded, no reset_parameters, no init hook wrote it)")
        elif bad:
            for s in bad:
                region = "" if s.region is None else f" (region {list(s.region)})"
                problems.append(f"{where}{region}: {s.reason}")
        elif steps[0].region is not None and regions.covers([s.region for s in steps], entry.shape):
            # Slices that together write every element: the service wants a
            # whole-tensor first step, and `empty` writes nothing.
            entry.steps = steps = [Step(schemes.empty(), None)] + steps
        elif steps[0].region is not None:
            problems.append(f"{where}: only part of it is initialized "
                            f"(region {list(steps[0].region)}); nothing writes the rest")
        if len(steps) > MAX_STEPS:
            problems.append(f"{where}: its init is {len(steps):,} steps, more than the "
                            f"{MAX_STEPS:,} a tensor may have")
        for s in steps:
            if s.known and s.scheme.kind == "values":
                n = s.scheme.params["data"].numel() * entry.dtype.itemsize
                literal_total += n
                if n > max_literal:
                    problems.append(f"{where}: holds {n:,} bytes of values computed in "
                                    f"this process, more than the {max_literal:,}-byte "
                                    "limit for literal values")
        if g.dtensor:
            shards[g.key] = _shard_box(g, boxes)
            has_shards = True
    for s, g in slots_in_order(groups):
        if g.key not in by_key:
            continue
        root = s.name == g.root
        tensors.append(TensorDesc(
            s.name, tuple(g.tensor.shape), g.tensor.dtype, kind=s.kind,
            persistent=s.persistent, module_type=type(s.module).__name__,
            tie_to=None if root else g.root,
            steps=by_key[g.key].steps if root else (),
            shard=shards.get(g.key), requires_grad=bool(g.tensor.requires_grad),
            real=g.key in real))
    if literal_total > max_total:
        problems.append(f"the model carries {literal_total:,} bytes of literal values, "
                        f"more than the {max_total:,}-byte limit per request")
    if problems:
        raise CaptureError(
            f"cannot describe the init of {type(model).__name__}: "
            f"{len(problems)} problem(s). Fix the init code, build the model under "
            "materializer.meta_device() to keep constructor values, or give these "
            "tensors a scheme with overrides={'<name or glob>': scheme}.", problems)
    if has_shards and rng != "portable":
        raise CaptureError("shards (DTensor parameters) need rng='portable': only "
                           "portable values are the same for any shard of a tensor")
    modules = []
    for name, m in model.named_modules():
        idx = getattr(m, "padding_idx", None)
        if type(m).__name__ in ("Embedding", "EmbeddingBag") and idx is not None:
            if any(t.name.startswith(name + ".") and not t.tie_to for t in tensors):
                modules.append((name, type(m).__name__, int(idx)))
    for t in tensors:
        dtype_name(t.dtype)  # refuse dtypes the service has not
    return Spec(tensors, seed=seed, rng=rng, modules=modules)


def _shard_box(group, boxes):
    """The global (offset, length) per dimension of the shard this rank
    holds; `boxes` memoizes them by shape, mesh and placements (torch's
    computation costs about 30 us a tensor, and a model's layers repeat a
    few shapes)."""
    from torch.distributed.tensor import Replicate, Shard
    dt = group.tensor
    key = (tuple(dt.shape), id(dt.device_mesh), tuple(dt.placements))
    box = boxes.get(key)
    if box is not None:
        return box
    where = f"{group.root} ({group.owner_class})"
    for p in dt.placements:
        if type(p) is Shard or isinstance(p, Replicate):
            continue
        raise CaptureError(
            f"{where}: placement {type(p).__name__} ({p}) is not supported; the service materializes "
            "Shard(dim) boxes (and Replicate, the whole tensor), not partial sums "
            "or strided shards")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local_shape, offset = compute_local_shape_and_global_offset(
        dt.shape, dt.device_mesh, dt.placements)
    box = boxes[key] = tuple((int(o), int(l)) for o, l in zip(offset, local_shape))
    return box
