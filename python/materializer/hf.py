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
import sys

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


def checkpoint_key_rules(model, keys):
    """The key rules (from, to) that make the server read a checkpoint of
    `model` as transformers' from_pretrained reads it, given the
    checkpoint's tensor names `keys`: save_pretrained writes the names the
    library's conversions map from (Mixtral's `block_sparse_moe`, LLaVA's
    `language_model.model`), not the module's. [] when the names already
    match. Raises CheckpointLayoutError when the checkpoint holds tensors
    transformers converts rather than renames (experts stored one by one
    and merged, halves concatenated, a transpose), or renamings that prefix
    rules cannot express: loaded by name, those tensors would silently have
    kept their random init."""
    from materializer.errors import CheckpointLayoutError
    found = _conversions(model)
    if found is None:
        return []
    renamings, converters, rename_source_key = found
    state = model.state_dict(keep_vars=True)
    prefix = getattr(model, "base_model_prefix", None)
    renamed = {}     # module name -> checkpoint key
    converted = {}   # module name -> (checkpoint keys, operations)
    for key in keys:
        name, pattern = rename_source_key(key, renamings, converters, prefix, state)
        if name not in state and key in state:   # as transformers falls back
            name, pattern = rename_source_key(key, [], [], prefix, state)
        if name not in state:
            continue
        if pattern is not None:
            ops = next((", ".join(type(o).__name__ for o in c.operations)
                        for c in converters if pattern in c.source_patterns), "")
            converted.setdefault(name, ([], ops))[0].append(key)
        else:
            renamed[name] = key
    if converted:
        names = sorted(converted)
        lines = [f"{n} <- {', '.join(converted[n][0][:3])}"
                 f"{' ...' if len(converted[n][0]) > 3 else ''} ({converted[n][1] or 'converted'})"
                 for n in names[:5]]
        raise CheckpointLayoutError(
            f"{len(names)} tensors of {type(model).__name__} are stored in this checkpoint "
            "in a layout transformers converts while loading, which the server does not "
            "do (it reads each tensor by name); they would have kept their random init:\n  "
            + "\n  ".join(lines) + ("\n  ..." if len(names) > 5 else "")
            + "\nLoad this model with transformers' from_pretrained, or save it in the "
            "module's own layout (safetensors.torch.save_file(model.state_dict(), ...)).")
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
        if name not in renamed and apply(name) in present and apply(name) != name:
            rules[name] = name
        elif name in renamed and apply(name) != renamed[name]:
            rules[name] = renamed[name]
    ordered = sorted(rules.items(), key=lambda r: -len(r[0]))
    def misread(name):
        got = apply(name)
        if name in renamed:
            return got != renamed[name]
        return got != name and got in present   # would load another tensor's bytes
    wrong = [n for n in state if misread(n)]
    from materializer.checkpoint import MAX_KEY_RULES
    if wrong or len(ordered) > MAX_KEY_RULES:
        why = (f"{len(ordered)} key rules, more than the server's {MAX_KEY_RULES}"
               if not wrong else f"no prefix rules map {wrong[0]} as transformers does")
        raise CheckpointLayoutError(
            f"this checkpoint names {type(model).__name__}'s tensors as transformers' "
            f"conversions read them, and {why}; pass a materializer.Checkpoint with "
            "your own key_rules")
    return ordered


def adapt_checkpoint(model, source, client):
    """`source` (a materializer.Checkpoint) for a Hugging Face `model`,
    with the key rules transformers' conversions imply (checkpoint_key_rules)
    where the caller gave none. One InspectCheckpoint call, only for a model
    whose class has conversions."""
    from materializer.checkpoint import Checkpoint
    if _conversions(model) is None:
        return source
    keys = [t.key for t in client.inspect_checkpoint(source.path).tensors]
    rules = checkpoint_key_rules(model, keys)
    if source.key_rules or not rules:
        return source
    return Checkpoint(source.path, key_rules=rules, dtype_policy=source.dtype_policy,
                      require_all=source.require_all)
