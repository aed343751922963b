"""Hugging Face models: a thin adapter over capture.

    model = materializer.hf.from_config(config)                # on meta
    materializer.materialize(model, server=..., device="cuda:0")
    # or in one call:
    model = materializer.hf.materialize(config, server=..., device="cuda:0")

What is Hugging Face specific is the init protocol, not any architecture:
the hook is the model's own `init_weights()` (every submodule's
`_init_weights`, children first, then the ties), run with tied weights
untied because the library initializes before it ties, and with the
`_is_hf_initialized` flags it sets saved and restored so that describing
a model twice, or describing then loading it, sees the same model.
"""

import contextlib
import copy
import sys

import torch

from materializer._optional import require
from materializer.capture import InitHook, meta_device

_FLAG = "_is_hf_initialized"


def is_hf_model(model):
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def tie_sources(model):
    """The names that own their tie group: the sources of the model's tie
    mapping (target -> source)."""
    mapping = None
    get = getattr(model, "get_expanded_tied_weights_keys", None)
    if callable(get):
        try:
            mapping = get(all_submodels=True)
        except TypeError:
            mapping = get()
    if mapping is None:
        mapping = getattr(model, "all_tied_weights_keys", None) or {}
    if isinstance(mapping, dict):
        return set(mapping.values())
    return set()


@contextlib.contextmanager
def _fresh_flags(model):
    """Clears `_is_hf_initialized` on every module and tensor (so the hook
    initializes everything) and puts the previous values back after."""
    objects = list(model.modules())
    objects += [t for _, t in model.named_parameters(remove_duplicate=False)]
    objects += [t for _, t in model.named_buffers(remove_duplicate=False)]
    saved = []
    for obj in objects:
        if _FLAG in getattr(obj, "__dict__", {}):
            saved.append((obj, obj.__dict__[_FLAG]))
            delattr(obj, _FLAG)
    try:
        yield
    finally:
        for obj in objects:
            if _FLAG in getattr(obj, "__dict__", {}):
                delattr(obj, _FLAG)
        for obj, value in saved:
            setattr(obj, _FLAG, value)


def init_hook(model):
    """The InitHook of a Hugging Face model."""
    def run(m):
        m.init_weights()

    return InitHook(run, untied=True, tie_roots=tie_sources(model),
                    context=lambda: _fresh_flags(model),
                    name=f"{type(model).__name__}.init_weights")


def config_from_json(text):
    """A transformers config from the text of a config.json, read by the
    library's own reader, as its from_pretrained reads it: special floats
    (save_pretrained stores Infinity as {"__float__": "Infinity"}), nested
    configs, validation after loading. Building it from the parsed JSON
    (AutoConfig.for_model(**fields)) failed validation for such configs."""
    import os
    import tempfile
    transformers = require("transformers", "a Hugging Face config")
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            f.write(text)
        return transformers.AutoConfig.from_pretrained(folder)


def from_config(config, auto_class="AutoModel", record_constructor=True, **kwargs):
    """Builds the model of `config` on the meta device, without downloading
    anything. auto_class: an auto class or a concrete model class
    (`LlamaForCausalLM`), or its name in transformers ("AutoModelForCausalLM",
    ...): an auto class builds with `from_config`, a model class with
    `_from_config` (what from_config calls for it). With record_constructor
    (default) it is built under materializer.meta_device(), so values
    constructors write are kept."""
    import torch
    transformers = require("transformers", "materializer.hf")
    cls = getattr(transformers, auto_class) if isinstance(auto_class, str) else auto_class
    build = getattr(cls, "from_config", None) or getattr(cls, "_from_config", None) or cls
    ctx = meta_device() if record_constructor else torch.device("meta")
    with ctx:
        return build(config, **kwargs)


def materialize(config, auto_class="AutoModel", **kwargs):
    """from_config on meta, then materializer.materialize(model, **kwargs)
    (which passes describe()'s keywords, such as keep_real, on); returns
    the model with its weights in place."""
    from materializer.api import materialize as _materialize
    model = from_config(config, auto_class)
    _materialize(model, **kwargs)
    return model


def from_pretrained(path, server=None, *, model_class=None, client=None, tls=None,
                    token=None, config_overrides=None, **kwargs):
    """What transformers' from_pretrained does, with the server reading the
    checkpoint: the config.json of the folder `path` (ROOT/relative/path
    under the server's --checkpoint_roots) builds the model on the meta
    device, and materialize(model, checkpoint=path) fills it, tensors the
    checkpoint lacks from the model's own init. model_class: a class or its
    name (default: the config's first `architectures` entry, else
    AutoModel). config_overrides: config attributes to set first
    (num_labels=3, ...). Returns (model, Materialized)."""
    import json
    from materializer.api import _client_for, materialize as _materialize
    transformers = require("transformers", "materializer.hf")
    own, own_client = _client_for(server, client, tls, token, None, session=False)
    try:
        contents = own.inspect_checkpoint(path)
    finally:
        if own_client:
            own.close()
    if not contents.config_json:
        raise FileNotFoundError(
            f"{path}: the server found no config.json there (from_pretrained needs "
            "the folder save_pretrained wrote; build the model yourself and pass "
            "checkpoint= to materialize())")
    if "model_type" not in json.loads(contents.config_json):
        raise ValueError(f"{path}/config.json has no model_type")
    config = config_from_json(contents.config_json)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    if model_class is None:
        archs = getattr(config, "architectures", None) or []
        model_class = archs[0] if archs and hasattr(transformers, archs[0]) else "AutoModel"
    model = from_config(config, model_class)
    result = _materialize(model, server=server, client=client, tls=tls, token=token,
                          checkpoint=path, **kwargs)
    return model, result



def _conversions(model):
    """transformers' load-time conversions for `model` (renamings and
    converters), or None where this transformers has none for it."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     rename_source_key)
    except ImportError:   # a transformers from before load-time conversions
        return None
    mapping = get_model_conversion_mapping(model) or []
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    if not renamings and not converters:
        return None
    return renamings, converters, rename_source_key


class _NotBoxes(Exception):
    """A conversion whose result is no set of boxes of checkpoint tensors
    (a transpose, an interleave, arithmetic)."""


def _dim(d, rank):
    return d + rank if d < 0 else d


class _Boxes:
    """A tensor transformers' load-time conversions would build, as boxes of
    checkpoint tensors instead of values: torch.stack, cat, chunk, split and
    squeeze act on the boxes as they would on the elements, so that
    transformers' own conversion code says where each element comes from.
    Any other operation raises _NotBoxes. parts: [key, key_offset,
    key_shape, offset, shape] (the server's AssemblyPart)."""

    def __init__(self, shape, parts):
        self.shape = torch.Size(shape)
        self.parts = parts

    @classmethod
    def whole(cls, key, shape):
        zeros = [0] * len(shape)
        return cls(shape, [[key, zeros, list(shape), list(zeros), list(shape)]])

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    ndim = property(dim)

    def contiguous(self, *args, **kwargs):
        return self

    def chunk(self, chunks, dim=0):
        return _Boxes._chunk(self, chunks, dim)

    def split(self, sizes, dim=0):
        return _Boxes._split(self, sizes, dim)

    def squeeze(self, dim=None):
        if dim is None or self.shape[_dim(dim, self.dim())] != 1:
            raise _NotBoxes("squeeze")
        d = _dim(dim, self.dim())
        shape = list(self.shape[:d]) + list(self.shape[d + 1:])
        return _Boxes(shape, [[k, ko, ks, o[:d] + o[d + 1:], sh[:d] + sh[d + 1:]]
                              for k, ko, ks, o, sh in self.parts])

    def _slice(self, dim, lo, hi):
        """Elements [lo, hi) along `dim`."""
        parts = []
        for key, key_offset, key_shape, offset, shape in self.parts:
            a, b = max(offset[dim], lo), min(offset[dim] + shape[dim], hi)
            if a >= b:
                continue
            key_offset, key_shape = list(key_offset), list(key_shape)
            if shape[dim] != 1:
                # The n-th dim of size > 1 of the box is the n-th of the key's.
                n = sum(1 for s in shape[:dim] if s != 1)
                k = [i for i, s in enumerate(key_shape) if s != 1][n]
                key_offset[k] += a - offset[dim]
                key_shape[k] = b - a
            offset, shape = list(offset), list(shape)
            offset[dim], shape[dim] = a - lo, b - a
            parts.append([key, key_offset, key_shape, offset, shape])
        return _Boxes(list(self.shape[:dim]) + [hi - lo] + list(self.shape[dim + 1:]), parts)

    @staticmethod
    def _pieces(t, sizes, dim):
        d = _dim(dim, t.dim())
        out, at = [], 0
        for n in sizes:
            out.append(t._slice(d, at, at + n))
            at += n
        return tuple(out)

    @staticmethod
    def _chunk(t, chunks, dim=0):
        meta = torch.empty(t.shape, device="meta")
        return _Boxes._pieces(t, [c.shape[dim] for c in torch.chunk(meta, chunks, dim)], dim)

    @staticmethod
    def _split(t, sizes, dim=0):
        meta = torch.empty(t.shape, device="meta")
        return _Boxes._pieces(t, [c.shape[dim] for c in torch.split(meta, sizes, dim)], dim)

    @staticmethod
    def _stack(tensors, dim=0):
        tensors = list(tensors)
        shape = tensors[0].shape
        if not all(isinstance(t, _Boxes) and t.shape == shape for t in tensors):
            raise _NotBoxes("stack of tensors of different shapes")
        d = _dim(dim, len(shape) + 1)
        parts = [[k, ko, ks, o[:d] + [i] + o[d:], sh[:d] + [1] + sh[d:]]
                 for i, t in enumerate(tensors) for k, ko, ks, o, sh in t.parts]
        return _Boxes(list(shape[:d]) + [len(tensors)] + list(shape[d:]), parts)

    @staticmethod
    def _cat(tensors, dim=0):
        tensors = list(tensors)
        if not all(isinstance(t, _Boxes) for t in tensors):
            raise _NotBoxes("cat of stored and computed tensors")
        d = _dim(dim, tensors[0].dim())
        shape, parts, at = list(tensors[0].shape), [], 0
        for t in tensors:
            if list(t.shape[:d]) + list(t.shape[d + 1:]) != shape[:d] + shape[d + 1:]:
                raise _NotBoxes("cat of tensors of different shapes")
            for k, ko, ks, o, sh in t.parts:
                o = list(o)
                o[d] += at
                parts.append([k, ko, ks, o, sh])
            at += t.shape[d]
        shape[d] = at
        return _Boxes(shape, parts)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        table = {torch.stack: cls._stack, torch.cat: cls._cat, torch.concat: cls._cat,
                 torch.concatenate: cls._cat, torch.chunk: cls._chunk,
                 torch.Tensor.chunk: cls._chunk, torch.split: cls._split,
                 torch.Tensor.split: cls._split}
        if func in table:
            return table[func](*args, **kwargs)
        if func in (torch.squeeze, torch.Tensor.squeeze):
            return args[0].squeeze(*args[1:], **kwargs)
        raise _NotBoxes(getattr(func, "__name__", str(func)))


# A conversion that reorders the elements of one stored tensor is traced
# on its element indices up to this size (a vision tower's projections;
# not a model's experts, which are refused).
_MAX_TRACED_ELEMENTS = 1 << 24


def _unravel(flat, shape):
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def _run_parts(key, shape, out_shape, flat):
    """Parts for a reordering `flat` (the stored element index of each
    element of the result, in order): one per maximal run that is
    contiguous in the stored tensor and stays within one row of each."""
    from materializer.checkpoint import MAX_PARTS_PER_TENSOR
    row = shape[-1] if shape else 1
    cols = out_shape[-1] if out_shape else 1
    n = flat.numel()
    i = torch.arange(1, n)
    cut = (flat[1:] != flat[:-1] + 1) | (i % cols == 0) | (flat[1:] % row == 0)
    starts = [0] + (cut.nonzero().flatten() + 1).tolist()
    if len(starts) > MAX_PARTS_PER_TENSOR:
        raise _NotBoxes(f"the reordering of {key} needs {len(starts):,} parts, more than "
                        f"the server's {MAX_PARTS_PER_TENSOR:,}")
    parts = []
    for p0, p1 in zip(starts, starts[1:] + [n]):
        length = p1 - p0
        parts.append([key, _unravel(int(flat[p0]), shape), [1] * (len(shape) - 1) + [length],
                      _unravel(p0, out_shape), [1] * (len(out_shape) - 1) + [length]])
    return parts


def _traced_parts(converter, pattern, name, key, shape, model, state):
    """{target: parts} for a conversion of the one stored tensor `key`
    that reorders its elements (PermuteForRope, Interleave): transformers'
    conversion runs on the tensor's element indices (int64), and each row
    of a result (or run of rows, for matrices) that holds a contiguous run
    of one row of the stored tensor becomes a part. The parts are checked
    to rebuild every index. Raises _NotBoxes, saying why, for a tensor
    too large to trace, a result that is not a reordering (arithmetic, a
    value used twice) or one that needs more parts than the server takes."""
    from materializer.checkpoint import MAX_PARTS_PER_TENSOR
    numel = 1
    for size in shape:
        numel *= size
    if numel > _MAX_TRACED_ELEMENTS:
        raise _NotBoxes(f"{key} has {numel:,} elements, more than the "
                        f"{_MAX_TRACED_ELEMENTS:,} a reordering is traced for")
    conv = copy.deepcopy(converter)
    conv.add_tensor(name, key, pattern, torch.arange(numel, dtype=torch.int64).view(shape))
    with torch.no_grad():
        out = conv.convert(name, model=model, config=model.config)
    found, seen = {}, 0
    row = shape[-1] if shape else 1
    for target, t in out.items():
        want = tuple(state[target].shape) if target in state else None
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int64
                or tuple(t.shape) != want):
            raise _NotBoxes(f"{target} is not a reordering of {key}")
        flat = t.reshape(-1)
        if flat.numel() == 0:
            continue       # nothing to read
        if (int(flat.min()) < 0 or int(flat.max()) >= numel
                             or torch.unique(flat).numel() != flat.numel()):
            raise _NotBoxes(f"{target} is not a reordering of {key}")
        seen += flat.numel()
        out_shape = list(t.shape)
        cols = out_shape[-1] if out_shape else 1
        rows = flat.numel() // cols if cols else 0
        m = flat.view(rows, cols)
        starts = m[:, 0]
        if ((cols > 1 and not bool((m[:, 1:] - m[:, :-1] == 1).all()))
                or bool(((starts % row) + cols > row).any())):
            # Rows that are no run of one stored row: runs within them.
            found[target] = _run_parts(key, shape, out_shape, flat)
            continue
        # Rows that continue each other in the stored matrix merge.
        merge = len(out_shape) == 2 and len(shape) == 2 and cols == row
        breaks = ((starts[1:] != starts[:-1] + row).nonzero().flatten() + 1).tolist() \
            if merge else list(range(1, rows))
        if len(breaks) + 1 > MAX_PARTS_PER_TENSOR:
            raise _NotBoxes(f"{target} needs {len(breaks) + 1:,} parts, more than the "
                            f"server's {MAX_PARTS_PER_TENSOR:,}")
        parts, rebuilt = [], torch.empty_like(flat)
        for r0, r1 in zip([0] + breaks, breaks + [rows]):
            a = int(starts[r0])
            n = r1 - r0 if merge else 1
            if merge:
                t_shape, k_shape = [n, cols], [n, cols]
            else:
                t_shape = [1] * (len(out_shape) - 1) + [cols] if out_shape else []
                k_shape = [1] * (len(shape) - 1) + [cols] if shape else []
            parts.append([key, _unravel(a, shape), k_shape,
                          _unravel(r0 * cols, out_shape), t_shape])
            rebuilt[r0 * cols:(r0 + n) * cols] = torch.arange(n * cols).view(n, cols) \
                .add_(torch.arange(n).view(n, 1) * (row - cols)).view(-1) + a
        if not torch.equal(rebuilt, flat):
            raise _NotBoxes(f"{target}: the parts do not rebuild the reordering of {key}")
        found[target] = parts
    if seen != numel:
        raise _NotBoxes(f"the results use {seen:,} of the {numel:,} elements of {key}")
    return found


def checkpoint_layout(model, tensors):
    """How the server reads a checkpoint of `model` as transformers'
    from_pretrained reads it, given the checkpoint's tensors `tensors`
    ({key: shape}): (key rules, assemblies). save_pretrained writes the
    names transformers' conversions map from (Mixtral's `block_sparse_moe`,
    LLaVA's `language_model.model`), not the module's: the renamings become
    prefix key rules; tensors the library builds from several checkpoint
    tensors (experts stored one by one and stacked, gate and up projections
    concatenated, a fused projection chunked) become assemblies
    ({tensor: [[key, key_offset, key_shape, offset, shape], ...]}), found by
    running transformers' own conversion operations on boxes instead of
    values. Raises CheckpointLayoutError for a conversion no boxes express
    (a transpose, an interleave) or renamings prefix rules cannot: loaded by
    name, those tensors would silently have kept their random init."""
    from materializer.errors import CheckpointLayoutError
    found = _conversions(model)
    if found is None:
        return [], {}
    renamings, converters, rename_source_key = found
    try:   # the order transformers collects a converter's tensors in
        from transformers.core_model_loading import dot_natural_key
    except ImportError:
        def dot_natural_key(key):
            return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split(".")]
    state = model.state_dict(keep_vars=True)
    prefix = getattr(model, "base_model_prefix", None)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    renamed = {}      # module name -> checkpoint key
    converting = {}   # module name -> a converter collecting its keys
    keys_of = {}      # module name -> the checkpoint keys it converts
    pattern_of = {}   # module name -> the source pattern that matched first
    for key in sorted(tensors, key=dot_natural_key):
        name, pattern = rename_source_key(key, renamings, converters, prefix, state)
        if name not in state and key in state:   # as transformers falls back
            name, pattern = rename_source_key(key, [], [], prefix, state)
        if name not in state:
            continue
        if pattern is not None:
            pattern_of.setdefault(name, pattern)
            conv = converting.setdefault(name, copy.deepcopy(by_pattern[pattern]))
            conv.add_tensor(name, key, pattern, _Boxes.whole(key, list(tensors[key])))
            keys_of.setdefault(name, []).append(key)
        else:
            renamed[name] = key
    assemblies, refused = {}, {}
    for name, conv in converting.items():
        ops = ", ".join(type(o).__name__ for o in conv.operations)
        try:
            with torch.no_grad():
                out = conv.convert(name, model=model, config=model.config)
        except Exception as e:  # noqa: BLE001 - every failure is a refusal naming it
            why = f"{ops}: {e}" if isinstance(e, _NotBoxes) else f"{ops}"
            if len(keys_of[name]) == 1:
                # A reordering of one stored tensor (a rotary permutation,
                # an interleave): traced element by element.
                key = keys_of[name][0]
                try:
                    assemblies.update(_traced_parts(
                        by_pattern[pattern_of[name]], pattern_of[name], name, key,
                        list(tensors[key]), model, state))
                    continue
                except Exception as traced:  # noqa: BLE001 - refused, naming why
                    why = f"{ops}: {traced}" if isinstance(traced, _NotBoxes) else why
            refused[name] = (keys_of[name], why)
            continue
        for target, boxes in out.items():
            if isinstance(boxes, _Boxes) and boxes.shape.numel() == 0:
                continue   # nothing to read
            if (target not in state or not isinstance(boxes, _Boxes)
                    or tuple(boxes.shape) != tuple(state[target].shape)):
                refused[name] = (keys_of[name], ops)
                break
            assemblies[target] = boxes.parts
    if refused:
        names = sorted(refused)
        lines = [f"{n} <- {', '.join(refused[n][0][:3])}"
                 f"{' ...' if len(refused[n][0]) > 3 else ''} ({refused[n][1]})"
                 for n in names[:5]]
        raise CheckpointLayoutError(
            f"{len(names)} tensors of {type(model).__name__} are stored in this checkpoint "
            "in a layout transformers converts while loading with an operation the server "
            "cannot express as boxes of stored tensors; they would have kept their random "
            "init:\n  " + "\n  ".join(lines) + ("\n  ..." if len(names) > 5 else "")
            + "\nLoad this model with transformers' from_pretrained, or save it in the "
            "module's own layout (safetensors.torch.save_file(model.state_dict(), ...)).")
    keys = list(tensors)
    rules = {}
    for name, key in renamed.items():
        if name == key:
            continue
        a, b = name.split("."), key.split(".")
        same = 0
        while same < min(len(a), len(b)) and a[-1 - same] == b[-1 - same]:
            same += 1
        src = ".".join(a[:len(a) - same]) + ("." if same < len(a) else "")
        dst = ".".join(b[:len(b) - same]) + ("." if same < len(b) else "")
        if same == 0:
            src, dst = name, key
        if rules.setdefault(src, dst) != dst:
            rules[name] = key   # this name alone
    ordered = sorted(rules.items(), key=lambda r: -len(r[0]))

    def apply(name):
        for src, dst in ordered:
            if name.startswith(src):
                return dst + name[len(src):]
        return name

    present = set(keys)
    # A name a rule captures by mistake keeps its own name (an identity rule
    # ahead of the shorter one), once; what still differs is refused.
    for name in state:
        if name in assemblies:
            continue      # the server does not look an assembled tensor up
        if name not in renamed and apply(name) in present and apply(name) != name:
            rules[name] = name
        elif name in renamed and apply(name) != renamed[name]:
            rules[name] = renamed[name]
    ordered = sorted(rules.items(), key=lambda r: -len(r[0]))
    def misread(name):
        if name in assemblies:
            return False
        got = apply(name)
        if name in renamed:
            return got != renamed[name]
        return got != name and got in present   # would load another tensor's bytes
    wrong = [n for n in state if misread(n)]
    from materializer.checkpoint import MAX_KEY_RULE_FROM_BYTES, MAX_KEY_RULES
    from_bytes = sum(len(src.encode()) for src, _ in ordered)
    if wrong or len(ordered) > MAX_KEY_RULES or from_bytes > MAX_KEY_RULE_FROM_BYTES:
        why = (f"no prefix rules map {wrong[0]} as transformers does" if wrong else
               f"{len(ordered)} key rules ({from_bytes:,} bytes of prefixes), more than "
               f"the server's {MAX_KEY_RULES} ({MAX_KEY_RULE_FROM_BYTES:,} bytes)")
        raise CheckpointLayoutError(
            f"this checkpoint names {type(model).__name__}'s tensors as transformers' "
            f"conversions read them, and {why}; pass a materializer.Checkpoint with "
            "your own key_rules")
    return ordered, assemblies


def adapt_checkpoint(model, source, client):
    """`source` (a materializer.Checkpoint) for a Hugging Face `model`,
    with the key rules and assemblies transformers' conversions imply
    (checkpoint_layout); rules or assemblies the caller gave are kept. One
    InspectCheckpoint call, only for a model whose class has conversions."""
    from materializer.checkpoint import Checkpoint
    if _conversions(model) is None:
        return source
    contents = client.inspect_checkpoint(source.path)
    rules, assemblies = checkpoint_layout(
        model, {t.key: list(t.shape) for t in contents.tensors})
    rules = source.key_rules or rules
    assemblies = source.assemblies or assemblies
    if rules == source.key_rules and assemblies == source.assemblies:
        return source
    return Checkpoint(source.path, key_rules=rules, dtype_policy=source.dtype_policy,
                      require_all=source.require_all, assemblies=assemblies)
