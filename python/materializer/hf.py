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
    fields = json.loads(contents.config_json)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"{path}/config.json has no model_type")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    if model_class is None:
        archs = getattr(config, "architectures", None) or []
        model_class = archs[0] if archs and hasattr(transformers, archs[0]) else "AutoModel"
    model = from_config(config, model_class)
    result = _materialize(model, server=server, client=client, tls=tls, token=token,
                          checkpoint=path, **kwargs)
    return model, result

