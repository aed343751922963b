"""A sweep over the Hugging Face model classes of the installed transformers:
each one built from a small config (nothing downloaded), on the CPU as the
library does it and on the meta device under materializer.meta_device(),
then described (and materialized when a server is given) and compared,
tensor by tensor, with the CPU build.

    python tests/python/hf_sweep.py                      # capture + local values
    python tests/python/hf_sweep.py --server HOST:PORT   # + materialize()
    python tests/python/hf_sweep.py --only Llama,BertModel --json out.json

Needs MATERIALIZER_PY_PROTO (the generated code) and python/ on the path,
as tests/python/conftest.py sets up.

What is compared, per class:

* the names (parameters and buffers, persistent or not, ties included),
  shapes, dtypes and buffer persistence of the meta build, of its Spec and
  of the CPU build; ties (one storage under several names) the same;
* values: the CPU build is made twice, with torch seeds 0 and 1. An element
  equal in both is deterministic (a constant, a computed table, a zeroed
  padding row) and must be equal, bit for bit, in the materialized tensor;
  the other elements are random and are compared by distribution: mean and
  std within a tolerance from their sampling error (and from the spread
  between the two CPU builds), min and max within the CPU builds' support
  widened by half its range, everything finite;
* "values": without a server, the values of the captured steps computed
  in this process (materializer.reference, torch mode); with a server, the
  weights materialize() put into the model.

A materialized value that nobody wrote (NaN or inf where the CPU build is
finite, a magnitude 1e6 times the CPU build's, or a tensor left on the CPU
by a legacy constructor such as torch.Tensor(n), which the capture does not
see and materialize() does not fill) is the worst outcome, "garbage".

Outcomes (Result.status), best first: pass; build-error (the class does
not build from a small config, or is too large after shrinking: not the
materializer's business); capture-error (describe() raised: the
CaptureError's first problem, or the exception); mismatch (names, shapes,
dtypes, ties or values differ); garbage.

KNOWN lists the classes that do not pass, with the exact reason; the test
(test_hf_sweep.py) holds every swept class to pass or to its KNOWN entry.
"""

import argparse
import collections
import contextlib
import json
import math
import os
import re
import signal
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_HERE = os.path.dirname(os.path.abspath(__file__))
_PY = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "python")
if _PY not in sys.path:
    sys.path.insert(0, _PY)

import torch  # noqa: E402

# Largest model (parameters + buffers, after shrinking) the sweep builds.
MAX_ELEMENTS = 50_000_000
# Seconds one class may take (all builds, describe, materialize, compare).
TIME_LIMIT_S = 120
# Targets of the shrink: the widest width of a config is scaled down by a
# power of two to at most WIDTH, head counts by up to HEADS_DIVISOR.
WIDTH = 128
HEADS_DIVISOR = 8
LAYERS = 2
VOCAB = 512
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
MAX_POSITIONS = 512

STATUSES = ("pass", "build-error", "capture-error", "mismatch", "garbage")

# Classes that do not pass, with their status and exact reason, as this
# sweep produces them. Filled from a sweep run; test_hf_sweep.py checks it.
KNOWN = {
}

# The classes test_hf_sweep.py sweeps (a few minutes on two cores): the
# base class of many families that build fast from a small config, of
# every kind (decoders, encoders, encoder-decoders, MoE, state-space and
# hybrid, vision, audio, multimodal), and the KNOWN ones. The CLI sweeps
# them all.
TEST_CLASSES = (
    "AXK2Model", "AfmoeModel", "AlbertModel", "AriaTextModel", "AudioFlamingo3Encoder",
    "AudioFlamingo3Model", "BailingHybridModel", "BambaModel", "BeamModel", "BertModel",
    "BigBirdModel", "BitNetModel", "BloomModel", "CLIPModel", "ChineseCLIPVisionModel",
    "CodeGenModel", "ConvNextModel", "ConvNextV2Model", "Cosmos3EdgeVisionModel", "CwmModel",
    "DINOv3ConvNextModel", "DINOv3ViTModel", "DebertaModel", "DebertaV2Model",
    "DeepseekV32Model", "DeepseekV3Model", "DeepseekV4Model", "DeepseekVLModel", "DiaModel",
    "DiffLlamaModel", "Dinov2Model", "Dinov2WithRegistersModel", "DistilBertModel",
    "DogeModel", "DonutSwinModel", "DoryModel", "Ernie4_5_MoeModel", "ErnieModel",
    "EsmcModel", "EuroBertModel", "Exaone4Model", "Exaone4_5_VisionModel", "ExaoneMoeModel",
    "FNetModel", "FalconMambaModel", "FalconModel", "FocalNetModel", "FunAsrNanoEncoder",
    "FuyuModel", "GPT2ForQuestionAnswering", "GPT2LMHeadModel", "GPTBigCodeModel",
    "GPTJModel", "GPTNeoXJapaneseModel", "GPTNeoXModel", "Gemma3Model", "Gemma3TextModel",
    "Gemma4TextModel", "Gemma4UnifiedAssistantForCausalLM", "Gemma4UnifiedModel",
    "Gemma4UnifiedTextModel", "Gemma4VisionModel", "Glm46VModel", "Glm4Model",
    "Glm4vTextModel", "Glm5NextTextModel", "Glm5NextVisionModel", "GlmAsrEncoder",
    "GlmImageTextModel", "GlmImageVQVAE", "GlmModel", "GptOssModel", "GraniteModel",
    "GraniteMoeModel", "GraniteMoeSWAModel", "GraniteSWAModel", "GteModel", "HYV3Model",
    "HYV4VLTextModel", "HeliumModel", "ImageGPTModel", "JambaModel", "LlamaModel",
    "Llama4ForConditionalGeneration",  # a complex64 buffer (vision freqs_ci)
    "LlavaForConditionalGeneration", "Mamba2Model", "MambaModel", "Qwen2MoeModel",
    "Qwen3NextModel", "SEWDModel", "SwinModel", "T5Model", "ViTModel", "Wav2Vec2Model",
    "WavLMModel", "WhisperModel", "XLNetModel",
)


# -- which classes ---------------------------------------------------------------

def all_classes():
    """{class name: model_type} for every model class of transformers' auto
    mappings (MODEL_MAPPING_NAMES, MODEL_FOR_*_MAPPING_NAMES)."""
    from transformers.models.auto import modeling_auto
    out = {}
    for attr in sorted(dir(modeling_auto)):
        if not (attr.startswith("MODEL") and attr.endswith("MAPPING_NAMES")):
            continue
        for model_type, names in getattr(modeling_auto, attr).items():
            for name in (names if isinstance(names, (tuple, list)) else (names,)):
                out.setdefault(name, model_type)
    return dict(sorted(out.items()))


def representative(classes):
    """One class per model_type: its MODEL_MAPPING_NAMES (base) class when it
    has one, else the first in name order."""
    from transformers.models.auto import modeling_auto
    base = modeling_auto.MODEL_MAPPING_NAMES
    by_type = collections.defaultdict(list)
    for name, mt in classes.items():
        by_type[mt].append(name)
    picked = {}
    for mt, names in by_type.items():
        b = base.get(mt)
        b = b[0] if isinstance(b, (tuple, list)) else b
        picked[b if b in names else sorted(names)[0]] = mt
    return dict(sorted(picked.items()))


def test_set():
    """{class name: model_type} of TEST_CLASSES."""
    classes = all_classes()
    return {n: classes[n] for n in TEST_CLASSES}


def model_class(name):
    import transformers
    return getattr(transformers, name)


# -- small configs ---------------------------------------------------------------

_PRIMARY_RE = re.compile(r"^(hidden_size|hidden_sizes|d_model|n_embd|n_embed|embed_dim|"
                         r"embed_dims|dim|model_dim|width|embedding_size)$")
_WIDTH_RE = re.compile(r"(^|_)(dim|dims|size|sizes|channels|d_model|n_embd|n_embed|width|"
                       r"d_ff|n_inner|lora_rank|d_inner|d_state|hidden)$")
_HEAD_DIM_RE = re.compile(r"(^|_)(head_dim|d_kv|kv_channels|head_size|attention_head_dim|"
                          r"attention_head_size|d_head)$")
_HEADS_RE = re.compile(r"(^|_)(num_attention_heads|num_heads|n_head|n_heads|attention_heads|"
                       r"heads)$")
_KV_HEADS_RE = re.compile(r"(key_value_heads|kv_heads|num_query_groups)$")
_LAYERS_RE = re.compile(r"(^|_)(num_hidden_layers|num_layers|n_layer|n_layers|layers|"
                        r"num_blocks|depth)$")
_EXPERTS_RE = re.compile(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|"
                         r"num_routed_experts)$")
_TOPK_RE = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|top_k|"
                      r"moe_k|num_selected_experts)$")
_POSITIONS_RE = re.compile(r"^(max_position_embeddings|max_source_positions|"
                           r"max_target_positions|n_positions|max_seq_len)$")
_VOCAB_RE = re.compile(r"(vocab|codebook_size|num_codes|num_embeddings)")
_TOKEN_ID_RE = re.compile(r"(_token_id|_token_index|_token_ids)$")
# Names that look like widths but are inputs, fixed by the data, or not
# widths at all.
_KEEP_RE = re.compile(r"(input|mel|num_channels|in_channels|out_channels|image|patch|vocab|"
                      r"position|max_|label|feature_size|out_features|freq|window|codebook|"
                      r"num_classes|spectrogram|audio|chunk|frame|sample|bins|rope|kernel|"
                      r"stride|pool|batch|step|segment|block_size|group|bucket|span|shift|"
                      r"context|scale|rate|ratio|length|padding|crop|resolution|grid|"
                      r"pixel|mask|hop|fft|sampling|ngram|lookup|cache|seq|token|"
                      r"expert|min_|num_)")

# Shrink levels, tried in order until one builds under MAX_ELEMENTS:
# (widest primary width or None, head count divisor, layers cut), then the
# config's defaults as they are.
LEVELS = ((WIDTH, HEADS_DIVISOR, True), (WIDTH, 1, True), (4 * WIDTH, 1, True),
          (None, 1, True), (None, 1, False))


def _is_config(x):
    from transformers import PretrainedConfig
    return isinstance(x, PretrainedConfig)


def _configs(config):
    """config and its sub-configs (PretrainedConfig attributes, recursively)."""
    out, todo, seen = [], [config], set()
    while todo:
        c = todo.pop(0)
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        for v in list(vars(c).values()):
            if _is_config(v):
                todo.append(v)
            elif isinstance(v, (list, tuple)):
                todo.extend(x for x in v if _is_config(x))
    return out


def _ints(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(v):
    return isinstance(v, (list, tuple)) and v and all(_ints(x) for x in v)


def _max_width(configs):
    """The widest primary width (hidden_size, d_model, ...) of the configs."""
    widest = 0
    for c in configs:
        for k, v in vars(c).items():
            if not _PRIMARY_RE.search(k):
                continue
            if _ints(v):
                widest = max(widest, v)
            elif _int_list(v):
                widest = max(widest, max(v))
    return widest


def _try_set(c, k, v):
    try:
        setattr(c, k, v)
    except Exception:  # noqa: BLE001 - a validated attribute keeps its value
        pass


def shrink(config, width=WIDTH, heads_divisor=HEADS_DIVISOR, layers=True):
    """Makes `config` (and its sub-configs) small, in place: widths divided
    by one power of two F for the whole model, so that the widest primary
    width (hidden_size, d_model, ...) is at most `width` (None: widths
    kept) and widths that refer to each other across sub-configs stay
    equal; head counts by a power of two H <= min(F, heads_divisor)
    (explicit head dims scaled by H/F); layers to LAYERS (per-layer lists
    cut to match); vocab sizes to VOCAB (token ids above it moved below);
    experts to EXPERTS; position tables to MAX_POSITIONS."""
    configs = _configs(config)
    widest = _max_width(configs)
    f = 1
    while width is not None and widest // f > width and widest % (2 * f) == 0:
        f *= 2
    h = min(heads_divisor, f)
    for c in configs:
        _shrink_one(c, f, h, layers)
    return config


def _div(v, f, minimum=2):
    while f > 1 and (v % f or v // f < minimum):
        f //= 2
    return v // f


def _shrink_one(c, f, h, layers):
    items = [(k, v) for k, v in vars(c).items() if not k.startswith("_")]
    old_layers = {}
    vocab = None
    for k, v in items:
        if _is_config(v):
            continue
        if _KV_HEADS_RE.search(k) and _ints(v) and v > 0:
            _try_set(c, k, max(1, _div(v, h, 1)))
        elif _HEADS_RE.search(k) and (_ints(v) or _int_list(v)):
            if _ints(v):
                _try_set(c, k, _div(v, h, 1) if v > 0 else v)
            else:
                _try_set(c, k, type(v)(_div(x, h, 1) for x in v))
        elif _HEAD_DIM_RE.search(k) and _ints(v) and v > 0:
            _try_set(c, k, max(4, v * h // f) if v * h % f == 0 else max(4, v // f))
        elif _LAYERS_RE.search(k) and not k.startswith(("max_", "min_")) and (_ints(v) or _int_list(v)):
            if not layers:
                continue
            if _ints(v) and v > LAYERS:
                old_layers[k] = v
                _try_set(c, k, LAYERS)
            elif _int_list(v) and k.endswith(("depths", "depth", "layers", "num_blocks")):
                _try_set(c, k, type(v)(min(x, 1) if x > 0 else x for x in v))
        elif k == "depths" and _int_list(v) and layers:
            _try_set(c, k, type(v)(min(x, 1) if x > 0 else x for x in v))
        elif _EXPERTS_RE.search(k) and _ints(v) and v > EXPERTS:
            _try_set(c, k, EXPERTS)
        elif _TOPK_RE.search(k) and _ints(v) and v > EXPERTS_PER_TOKEN:
            _try_set(c, k, EXPERTS_PER_TOKEN)
        elif k in ("n_group", "topk_group") and _ints(v) and v > 1:
            _try_set(c, k, 1)
        elif k in ("n_shared_experts", "num_shared_experts") and _ints(v) and v > 1:
            _try_set(c, k, 1)
        elif _POSITIONS_RE.search(k) and _ints(v) and v > MAX_POSITIONS:
            _try_set(c, k, MAX_POSITIONS)
        elif _VOCAB_RE.search(k) and _ints(v) and v > VOCAB:
            _try_set(c, k, VOCAB)
            if k == "vocab_size":
                vocab = VOCAB
        elif _WIDTH_RE.search(k) and not _KEEP_RE.search(k):
            if _ints(v) and v > 0:
                _try_set(c, k, _div(v, f))
            elif _int_list(v):
                _try_set(c, k, type(v)(_div(x, f) for x in v))
    # Head counts that do not divide the width (a default that does not
    # build) become their greatest common divisor.
    width, heads = getattr(c, "hidden_size", None), getattr(c, "num_attention_heads", None)
    if _ints(width) and _ints(heads) and heads > 0 and width % heads and \
            not _ints(getattr(c, "head_dim", None)):
        _try_set(c, "num_attention_heads", math.gcd(width, heads))
    # Per-layer lists follow the layer count.
    for k, v in items:
        if isinstance(v, (list, tuple)) and old_layers and any(
                len(v) == n for n in old_layers.values()) and not _is_config(v):
            _try_set(c, k, type(v)(v[:LAYERS]))
        elif old_layers and _int_list(v) and re.search(r"(layers|layer_ids|indices|idx)", k) \
                and not _TOKEN_ID_RE.search(k):
            _try_set(c, k, type(v)(x for x in v if x < LAYERS))
    if vocab is not None:
        taken = vocab
        for k, v in items:
            if not _TOKEN_ID_RE.search(k):
                continue
            if _ints(v) and v >= vocab:
                taken -= 1
                _try_set(c, k, taken)
            elif _int_list(v) and any(x >= vocab for x in v):
                new = []
                for x in v:
                    if x >= vocab:
                        taken -= 1
                        x = taken
                    new.append(x)
                _try_set(c, k, type(v)(new))


def small_configs(cls):
    """Small configs for model class `cls`, smallest first: its
    config_class's defaults shrunk at each of LEVELS, then the defaults."""
    config_cls = getattr(cls, "config_class", None)
    if config_cls is None:
        raise BuildError(f"{cls.__name__} has no config_class")
    for width, heads, layers in LEVELS:
        yield shrink(config_cls(), width, heads, layers)
    yield config_cls()


# -- results -----------------------------------------------------------------------

class BuildError(Exception):
    pass


class Result:
    def __init__(self, name, model_type):
        self.name = name
        self.model_type = model_type
        self.status = "pass"
        self.reason = ""
        self.details = []
        self.notes = []
        self.elements = 0
        self.tensors = 0
        self.seconds = 0.0

    def fail(self, status, reason, details=()):
        if STATUSES.index(status) > STATUSES.index(self.status) or self.status == "pass":
            self.status = status
            self.reason = reason
        self.details.extend(details)

    def as_dict(self):
        return {"name": self.name, "model_type": self.model_type, "status": self.status,
                "reason": self.reason, "details": self.details[:50], "notes": self.notes[:20],
                "elements": self.elements, "tensors": self.tensors,
                "seconds": round(self.seconds, 2)}

    def line(self):
        s = f"{self.status:13s} {self.name} ({self.model_type}, {self.elements:,} elements, " \
            f"{self.seconds:.1f} s)"
        if self.reason:
            s += f": {self.reason}"
        return s


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds):
    if seconds is None or not hasattr(signal, "SIGALRM") or \
            signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None, signal.default_int_handler):
        yield
        return

    def alarm(signum, frame):
        raise _Timeout(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _one_line(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _exc(e):
    return _one_line(f"{type(e).__name__}: {e}")


def _where(e):
    """file:line of the innermost frame of `e` inside transformers or
    materializer."""
    tb = traceback.extract_tb(e.__traceback__)
    for fr in reversed(tb):
        if "transformers" in fr.filename or "materializer" in fr.filename:
            parts = fr.filename.replace(os.sep, "/").split("/")
            for root in ("transformers", "materializer"):
                if root in parts:
                    rel = "/".join(parts[len(parts) - parts[::-1].index(root) - 1:])
                    return f"{rel}:{fr.lineno}"
    return ""


# -- tensors --------------------------------------------------------------------

def named_tensors(model):
    """{name: tensor}: parameters and buffers, persistent or not, every name
    of a tied storage."""
    out = dict(model.named_parameters(remove_duplicate=False))
    out.update(model.named_buffers(remove_duplicate=False))
    return out


def persistent_buffers(model):
    sd = set(model.state_dict(keep_vars=True).keys())
    return {n for n, _ in model.named_buffers(remove_duplicate=False) if n in sd}


def tie_groups(tensors):
    """Frozensets of names sharing one storage (same data_ptr, shape and
    dtype), for groups of two or more."""
    groups = collections.defaultdict(set)
    for n, t in tensors.items():
        if t.device.type == "meta" or t.numel() == 0:
            continue  # zero-element tensors share the null storage, untied
        groups[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)].add(n)
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def _finite(t):
    if t.is_floating_point() or t.is_complex():
        return bool(torch.isfinite(t).all())
    return True


def _absmax(t):
    if t.numel() == 0:
        return 0.0
    x = t.detach().double().abs()
    x = x[torch.isfinite(x)]
    return float(x.max()) if x.numel() else 0.0


def compare_values(name, got, a, b):
    """Problems of `got` against the CPU builds `a` (seed 0) and `b` (seed
    1): a list of (status, text)."""
    out = []
    got, a, b = got.detach(), a.detach(), b.detach()
    if got.dtype != a.dtype or got.shape != a.shape:
        return [("mismatch", f"{name}: {got.dtype} {list(got.shape)} vs the CPU build's "
                             f"{a.dtype} {list(a.shape)}")]
    if got.numel() == 0:
        return out
    floating = a.is_floating_point() or a.is_complex()
    if floating:
        if not _finite(got) and _finite(a):
            bad = int((~torch.isfinite(got)).sum())
            return [("garbage", f"{name}: {bad} of {got.numel()} values are NaN or inf; "
                                "the CPU build's are finite")]
        scale = max(_absmax(a), _absmax(b), 1.0)
        big = _absmax(got)
        if big > 1e6 * scale:
            return [("garbage", f"{name}: magnitude {big:.3g}, the CPU build's at most "
                                f"{max(_absmax(a), _absmax(b)):.3g}")]
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    else:
        same = a == b
    if bool(same.all()):
        eq = (got == a) | ((torch.isnan(got) & torch.isnan(a)) if floating else False)
        if not bool(torch.as_tensor(eq).all()):
            diff = ~torch.as_tensor(eq)
            idx = tuple(int(i) for i in diff.nonzero()[0])
            msg = f"{name}: deterministic values differ at {int(diff.sum())} of " \
                  f"{got.numel()} elements, first {list(idx)}: {got[idx].item()!r} vs " \
                  f"{a[idx].item()!r}"
            if floating:
                d = (got.double() - a.double()).abs()
                d = d[torch.isfinite(d)]
                if d.numel():
                    msg += f" (max abs diff {float(d.max()):.3g})"
            out.append(("mismatch", msg))
        return out
    # Random (at least partly). Values equal to the CPU build's where the two
    # CPU builds differ would be values nobody wrote (garbage taken over).
    if torch.equal(got, a) or torch.equal(got, b):
        return [("garbage", f"{name}: equal to a CPU build's values, which vary with the "
                            "seed: nothing wrote it")]
    det = same
    if bool(det.any()):
        wrong = det & (got != a)
        if floating:
            wrong &= ~(torch.isnan(got) & torch.isnan(a))
        allowed = 2 + got.numel() * 2.0 ** -22  # chance equalities of random draws
        if int(wrong.sum()) > allowed:
            idx = tuple(int(i) for i in wrong.nonzero()[0])
            out.append(("mismatch", f"{name}: {int(wrong.sum())} of {int(det.sum())} "
                                    f"deterministic elements differ, first {list(idx)}: "
                                    f"{got[idx].item()!r} vs {a[idx].item()!r}"))
    x, ra, rb = got[~det], a[~det], b[~det]
    if not floating:
        lo, hi = min(int(ra.min()), int(rb.min())), max(int(ra.max()), int(rb.max()))
        if int(x.min()) < lo - (hi - lo) or int(x.max()) > hi + (hi - lo):
            out.append(("mismatch", f"{name}: values in [{int(x.min())}, {int(x.max())}], "
                                    f"the CPU builds' in [{lo}, {hi}]"))
        return out
    if a.is_complex():
        x, ra, rb = torch.view_as_real(x), torch.view_as_real(ra), torch.view_as_real(rb)
    x, ra, rb = x.double().flatten(), ra.double().flatten(), rb.double().flatten()
    n = x.numel()
    if n < 8:
        return out
    ref_abs = max(float(ra.abs().max()), float(rb.abs().max()))
    if n < 64:
        if float(x.abs().max()) > 10 * ref_abs + 1e-6:
            out.append(("mismatch", f"{name}: |values| up to {float(x.abs().max()):.4g}, "
                                    f"the CPU builds' up to {ref_abs:.4g}"))
        return out
    # Support: the CPU builds' range widened by half its width. A few
    # values outside it are allowed (torch's trunc_normal_ puts one in ~10^7
    # at its bound a or b: erfinv(-1) clamped) and left out of the moments,
    # as are such outliers of the CPU builds; values nobody wrote are caught
    # above by their magnitude.
    ra, rb = _trim(ra), _trim(rb)
    lo, hi = min(float(ra.min()), float(rb.min())), max(float(ra.max()), float(rb.max()))
    r = hi - lo
    inside = (x >= lo - 0.5 * r) & (x <= hi + 0.5 * r)
    outside = n - int(inside.sum())
    if outside > 1 + n // 10_000_000:
        out.append(("mismatch", f"{name}: {outside} of {n} values outside [{lo - 0.5 * r:.4g}, "
                                f"{hi + 0.5 * r:.4g}] (the CPU builds' range "
                                f"[{lo:.4g}, {hi:.4g}] widened by half): from "
                                f"{float(x.min()):.4g} to {float(x.max()):.4g}"))
    x = x[inside]
    n = x.numel()
    if n < 64:
        return out
    ma, mb, mg = float(ra.mean()), float(rb.mean()), float(x.mean())
    sa, sb, sg = float(ra.std()), float(rb.std()), float(x.std())
    m4 = float(((ra - ma) ** 4).mean())
    se_mean = sa / math.sqrt(n)
    se_std = math.sqrt(max(m4 - sa ** 4, 0.0) / n) / (2 * sa) if sa > 0 else 0.0
    tiny = 1e-6 * max(sa, abs(ma), 1e-12)
    mean_tol = 6 * se_mean + 3 * abs(ma - mb) + tiny
    std_tol = 6 * se_std + 3 * abs(sa - sb) + tiny + 0.01 * sa
    if abs(mg - ma) > mean_tol:
        out.append(("mismatch", f"{name}: mean {mg:.4g}, the CPU build's {ma:.4g} "
                                f"(tolerance {mean_tol:.2g}; n={n})"))
    if abs(sg - sa) > std_tol:
        out.append(("mismatch", f"{name}: std {sg:.4g}, the CPU build's {sa:.4g} "
                                f"(tolerance {std_tol:.2g}; n={n})"))
    return out


def _trim(v):
    """v without values more than 50 median absolute deviations from its
    median (none for a normal or uniform draw of any size)."""
    med = v.median()
    mad = (v - med).abs().median()
    if float(mad) == 0:
        return v
    return v[(v - med).abs() <= 50 * mad]


def local_values(spec):
    """{name: tensor} of every name of `spec`, computed in this process from
    the captured steps (materializer.reference, torch mode), ties sharing
    their root's tensor; names whose steps the reference cannot run are
    left out (second value: {name: why})."""
    from materializer import reference
    out = {d.name: torch.empty(d.shape, dtype=d.dtype) for d in spec.roots}
    skipped = {}
    try:
        reference.init_spec(out, spec)
    except Exception:  # noqa: BLE001 - tensor by tensor, to name the ones it cannot do
        # Sources of derived steps (norm_of) first.
        def derived(d):
            return any(st.scheme.kind == "norm_of" for st in d.steps)

        for d in sorted(spec.roots, key=derived):
            sources = {}
            for st in d.steps:
                if st.scheme.kind == "norm_of":
                    src = st.scheme.params["tensor"]
                    while spec[src].tie_to:
                        src = spec[src].tie_to
                    sources[st.scheme.params["tensor"]] = out.get(src)
            try:
                reference.init_tensor(out[d.name], d.steps, spec.seed, d.name, sources=sources)
            except Exception as e:  # noqa: BLE001
                skipped[d.name] = _exc(e)
        for n in skipped:
            out.pop(n, None)
    for d in spec.tensors:
        if d.tie_to and d.tie_to in out:
            out[d.name] = out[d.tie_to]
    return out, skipped


# -- one class --------------------------------------------------------------------

def _build_cpu(cls, config, seed):
    torch.manual_seed(seed)
    model = cls(config)
    model.eval()
    return model


def sweep_one(name, model_type="", server=None, time_limit=TIME_LIMIT_S,
              max_elements=MAX_ELEMENTS):
    """The Result of one model class."""
    import materializer
    r = Result(name, model_type)
    t0 = time.perf_counter()
    try:
        with _time_limit(time_limit):
            _sweep(r, name, server, max_elements, materializer)
    except _Timeout as e:
        r.fail("build-error", f"time limit: {e}")
    except Exception as e:  # noqa: BLE001 - the sweep's own failure, named
        where = _where(e)
        r.fail("mismatch", f"the sweep raised {_exc(e)}" + (f" [{where}]" if where else ""),
               [traceback.format_exc()[-2000:]])
    r.seconds = time.perf_counter() - t0
    return r


def _sweep(r, name, server, max_elements, materializer):
    try:
        cls = model_class(name)
        r.model_type = getattr(cls.config_class, "model_type", "") or r.model_type
        configs = small_configs(cls)
    except Exception as e:  # noqa: BLE001
        r.fail("build-error", f"config: {_exc(e)}")
        return
    # The smallest config that builds (on plain meta: cheap) under max_elements.
    config, error, smallest = None, None, None
    while True:
        try:
            candidate = next(configs)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001
            error = f"config: {_exc(e)}"
            continue
        try:
            with torch.device("meta"):
                plain = cls(candidate)
        except Exception as e:  # noqa: BLE001
            error = f"build: {_exc(e)}"  # the last: the least shrunk config's
            continue
        elements = sum(t.numel() for t in set(named_tensors(plain).values()))
        del plain
        if elements <= max_elements:
            config, r.elements = candidate, elements
            break
        smallest = elements if smallest is None else min(smallest, elements)
    if config is None:
        if smallest is not None:
            error = f"too large after shrinking: {smallest:,} elements"
        r.fail("build-error", error)
        return
    try:
        a = _build_cpu(cls, config, 0)
        b = _build_cpu(cls, config, 1)
    except Exception as e:  # noqa: BLE001
        r.fail("build-error", f"CPU build: {_exc(e)}")
        return
    try:
        with materializer.meta_device():
            model = cls(config)
    except Exception as e:  # noqa: BLE001
        where = _where(e)
        r.fail("capture-error", f"meta_device() build: {_exc(e)}" + (f" [{where}]" if where else ""))
        return
    ta, tb = named_tensors(a), named_tensors(b)
    tm = named_tensors(model)
    r.tensors = len(tm)
    for n, t in ta.items():
        if not (torch.isfinite(t).all() if t.is_floating_point() else True) or \
                (t.is_floating_point() and _absmax(t) > 1e15):
            r.notes.append(f"{n}: the CPU build holds non-finite or huge values")

    # Names, shapes, dtypes, persistence, ties of the meta build.
    if set(tm) != set(ta):
        extra, missing = sorted(set(tm) - set(ta)), sorted(set(ta) - set(tm))
        r.fail("mismatch", f"names differ from the CPU build: extra {extra[:3]}, "
                           f"missing {missing[:3]}")
    for n in sorted(set(tm) & set(ta)):
        if tuple(tm[n].shape) != tuple(ta[n].shape) or tm[n].dtype != ta[n].dtype:
            r.fail("mismatch", f"{n}: {tm[n].dtype} {list(tm[n].shape)} on meta, "
                               f"{ta[n].dtype} {list(ta[n].shape)} on the CPU")
    if persistent_buffers(model) != persistent_buffers(a):
        r.fail("mismatch", "persistent buffers differ from the CPU build: "
               f"{sorted(persistent_buffers(model) ^ persistent_buffers(a))[:3]}")
    legacy = sorted(n for n, t in tm.items() if t.device.type != "meta")
    if legacy:
        r.fail("garbage", f"{len(legacy)} tensor(s) not on the meta device after a "
                          f"meta_device() build (legacy constructor?): {', '.join(legacy[:3])}",
               [f"{n}: on {tm[n].device}" for n in legacy])

    # describe().
    try:
        spec = materializer.describe(model, rng="portable")
    except materializer.CaptureError as e:
        first = e.problems[0] if e.problems else str(e).splitlines()[0]
        more = f" (+{len(e.problems) - 1} more)" if len(e.problems) > 1 else ""
        r.fail("capture-error", _one_line(first) + more, [_one_line(p) for p in e.problems])
        return
    except Exception as e:  # noqa: BLE001
        where = _where(e)
        r.fail("capture-error", f"describe() crashed: {_exc(e)}" + (f" [{where}]" if where else ""),
               [traceback.format_exc()[-2000:]])
        return
    names = {d.name for d in spec.tensors}
    want = {n for n, t in tm.items() if t.device.type == "meta"}
    if names != want:
        r.fail("mismatch", f"spec names differ from the model's meta tensors: extra "
                           f"{sorted(names - want)[:3]}, missing {sorted(want - names)[:3]}")
    for d in spec.tensors:
        if d.name in ta and (tuple(d.shape) != tuple(ta[d.name].shape) or d.dtype != ta[d.name].dtype):
            r.fail("mismatch", f"{d.name}: spec {d.dtype} {list(d.shape)}, CPU "
                               f"{ta[d.name].dtype} {list(ta[d.name].shape)}")
    cpu_ties = {g for g in tie_groups(ta) if g <= names}
    spec_groups = collections.defaultdict(set)
    for d in spec.tensors:
        spec_groups[d.tie_to or d.name].add(d.name)
    spec_ties = {frozenset(g) for g in spec_groups.values() if len(g) > 1}
    if cpu_ties != spec_ties:
        r.fail("mismatch", f"ties differ: CPU {sorted(map(sorted, cpu_ties - spec_ties))[:2]}, "
                           f"spec {sorted(map(sorted, spec_ties - cpu_ties))[:2]}")

    # Values.
    if server:
        try:
            materializer.materialize(model, server=server, device="cpu", spec=spec)
        except Exception as e:  # noqa: BLE001
            r.fail("mismatch", f"materialize() raised {_exc(e)}")
            return
        got = named_tensors(model)
        if tie_groups(got) != tie_groups(ta):
            r.fail("mismatch", "ties of the materialized model differ from the CPU build's")
    else:
        got, skipped = local_values(spec)
        for n, why in skipped.items():
            r.notes.append(f"{n}: not computed locally: {why}")
        for n in legacy:
            got[n] = tm[n]
    problems = []
    for n in sorted(set(got) & set(ta)):
        problems.extend(compare_values(n, got[n], ta[n], tb[n]))
    if problems:
        problems.sort(key=lambda p: -STATUSES.index(p[0]))
        status = problems[0][0]
        r.fail(status, problems[0][1] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
               [p[1] for p in problems])


# -- the sweep ---------------------------------------------------------------------

def sweep(names=None, server=None, log=None, time_limit=TIME_LIMIT_S):
    """Results of `names` ({class name: model_type}; default: all_classes())."""
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    import transformers
    transformers.logging.set_verbosity_error()
    import warnings
    warnings.filterwarnings("ignore")
    names = all_classes() if names is None else names
    out = []
    for i, (name, mt) in enumerate(names.items()):
        r = sweep_one(name, mt, server=server, time_limit=time_limit)
        out.append(r)
        if log:
            log(f"[{i + 1}/{len(names)}] {r.line()}")
    return out


def summary(results):
    counts = collections.Counter(r.status for r in results)
    lines = [f"{len(results)} classes: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES)]
    groups = collections.defaultdict(list)
    for r in results:
        if r.status != "pass":
            key = re.sub(r"\d+", "N", r.reason)
            key = re.sub(r"^[\w.]+ \((\w+)\)", r"<name> (\1)", key)
            groups[(r.status, key)].append(r)
    for (status, key), rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  {len(rs):4d} {status}: {rs[0].reason}")
        lines.append(f"       e.g. {', '.join(x.name for x in rs[:3])}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", help="materializerd address: also materialize() and compare")
    p.add_argument("--only", help="comma-separated class names, or model_types, or regexes")
    p.add_argument("--representative", action="store_true",
                   help="one class per model_type (the base model class)")
    p.add_argument("--test-set", action="store_true",
                   help="the classes test_hf_sweep.py sweeps (TEST_CLASSES)")
    p.add_argument("--after", help="only classes whose name sorts after this one")
    p.add_argument("--shard", help="I/N: every N-th class from the I-th (0-based), to split a "
                                   "sweep across processes")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--time-limit", type=int, default=TIME_LIMIT_S)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    names = all_classes()
    if args.representative:
        names = representative(names)
    if args.test_set:
        names = test_set()
    if args.only:
        pats = [s.strip() for s in args.only.split(",") if s.strip()]
        names = {n: mt for n, mt in names.items()
                 if any(n == s or mt == s or re.fullmatch(s, n) for s in pats)}
    if args.after:
        names = {n: mt for n, mt in names.items() if n > args.after}
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        names = dict(list(names.items())[i::n])
    t0 = time.perf_counter()
    results = sweep(names, server=args.server, time_limit=args.time_limit,
                    log=None if args.quiet else (lambda s: print(s, flush=True)))
    print(summary(results))
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.as_dict() for r in results], f, indent=1)
    unknown = [r for r in results if r.status != "pass" and
               KNOWN.get(r.name) != (r.status, r.reason)]
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
