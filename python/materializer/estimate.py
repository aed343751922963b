"""Exact memory of a model: bytes per dtype, largest tensor, training
with Adam, and (given a server) where it fits now.

Inputs: a Spec, a request file (MaterializeRequest / PlanRequest JSON, or a
Spec saved with Spec.save), a Hugging Face config, or a meta module (its
names, shapes and ties are walked; its init is not needed).

Training with Adam (torch.optim.Adam or AdamW, states in the parameters'
dtype): every trainable parameter is held four times (weights, gradients,
exp_avg, exp_avg_sq), plus a 4-byte `step` per parameter tensor; buffers
once. Activations are not included.
"""

import collections
import json
import os

from materializer._optional import require
from materializer.capture import Spec, TensorDesc
from materializer.capture.walk import walk


def spec_of_module(model):
    """A shapes-only Spec of a module (tied names counted once)."""
    tensors = []
    for g in walk(model):
        for s in g.slots:
            tensors.append(TensorDesc(
                s.name, tuple(g.tensor.shape), g.tensor.dtype, kind=s.kind,
                persistent=s.persistent, tie_to=None if s.name == g.root else g.root,
                requires_grad=bool(s.kind == "parameter" and g.tensor.requires_grad)))
    return Spec(tensors)


def load_input(path, auto_class=None, dtype=None):
    """A Spec from a request/spec file, or a Hugging Face config (a
    config.json, or a folder holding one); nothing is downloaded."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    data = json.loads(text)
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data):
        model = hf_model(data, auto_class, dtype, text=text)
        return spec_of_module(model), data.get("model_type", "")
    spec = Spec.load(path)
    for t in spec.tensors:
        t.requires_grad = t.kind == "parameter"
    return spec, ""


def hf_model(config_dict, auto_class=None, dtype=None, text=None):
    """The model of a config.json (`config_dict`, parsed; `text`, as
    written) on the meta device."""
    import torch
    from materializer.hf import config_from_json
    transformers = require("transformers", "a Hugging Face config")
    if "model_type" in config_dict:
        config = config_from_json(text if text is not None else json.dumps(config_dict))
    else:
        config = transformers.AutoConfig.for_model(**config_dict)
    cls = None
    if auto_class:
        cls = getattr(transformers, auto_class)
    else:
        for arch in config_dict.get("architectures") or ():
            cls = getattr(transformers, arch, None)
            if cls is not None:
                break
        cls = cls or transformers.AutoModel
    kwargs = {}
    if dtype:
        kwargs["dtype"] = getattr(torch, dtype)
    with torch.device("meta"):
        if hasattr(cls, "from_config"):
            return cls.from_config(config, **kwargs)
        return cls._from_config(config, **kwargs)


class Estimate:
    """Numbers for one spec (this process's part, for a shard)."""

    def __init__(self, spec):
        self.spec = spec
        roots = spec.roots
        self.tensors = len(roots)
        self.names = len(spec.tensors)
        self.by_dtype = collections.OrderedDict()
        for dt, (n, b) in spec.by_dtype().items():
            self.by_dtype[dt] = {"tensors": n, "bytes": b}
        self.total_bytes = sum(t.nbytes for t in roots)
        self.parameters = sum(t.numel for t in roots if t.kind == "parameter")
        largest = max(roots, key=lambda t: t.nbytes, default=None)
        self.largest = (largest.name, largest.nbytes) if largest else ("", 0)
        trainable = [t for t in roots if t.kind == "parameter" and t.requires_grad]
        self.trainable_bytes = sum(t.nbytes for t in trainable)
        self.buffer_bytes = sum(t.nbytes for t in roots if t.kind == "buffer")
        frozen = sum(t.nbytes for t in roots if t.kind == "parameter" and not t.requires_grad)
        self.adam_bytes = (4 * self.trainable_bytes + 4 * len(trainable)
                           + frozen + self.buffer_bytes)

    def as_dict(self):
        return {"tensors": self.tensors, "names": self.names,
                "parameters": self.parameters, "total_bytes": self.total_bytes,
                "by_dtype": self.by_dtype,
                "largest_tensor": {"name": self.largest[0], "bytes": self.largest[1]},
                "training_adam_bytes": self.adam_bytes,
                "training_adam_formula": "4 x trainable parameter bytes + 4 bytes per "
                "trainable tensor (step) + frozen parameters + buffers"}


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return str(n)


def table(est, plan=None):
    """The estimate as text (and a server's Plan answer, if given)."""
    lines = []
    lines.append(f"tensors: {est.tensors:,} ({est.names:,} names, ties counted once); "
                 f"parameters: {est.parameters:,}")
    lines.append("")
    lines.append(f"{'dtype':<14}{'tensors':>10}{'bytes':>18}{'':>3}{'':<12}")
    for dt, v in est.by_dtype.items():
        lines.append(f"{dt:<14}{v['tensors']:>10,}{v['bytes']:>18,}   {human(v['bytes'])}")
    lines.append(f"{'total':<14}{est.tensors:>10,}{est.total_bytes:>18,}   {human(est.total_bytes)}")
    lines.append("")
    lines.append(f"largest tensor: {est.largest[0]} ({est.largest[1]:,} bytes, {human(est.largest[1])})")
    lines.append(f"training with Adam: {est.adam_bytes:,} bytes ({human(est.adam_bytes)}) = "
                 "4 x trainable parameters (weights, gradients, exp_avg, exp_avg_sq) "
                 "+ 4 B step per trainable tensor + frozen parameters + buffers; "
                 "activations not included")
    if plan is not None:
        lines.append("")
        lines.append(f"server plan: arena {plan.arena_bytes:,} bytes ({human(plan.arena_bytes)}, "
                     f"tensors + {plan.alignment}-byte alignment); placement now: "
                     f"{plan.placement or 'fits nowhere'}")
        lines.append(f"{'device':<12}{'available now':>20}  fits")
        for d in plan.devices:
            lines.append(f"{d.device:<12}{d.available_bytes:>20,}  {'yes' if d.fits else 'no'}")
        for w in plan.warnings:
            lines.append(f"warning: {w}")
    return "\n".join(lines)

