"""Helpers shared by the Python tests: seeds, request files, references."""

import contextlib
import json
import math
import os
import struct

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")

MASK64 = (1 << 64) - 1

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}

FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2}


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & MASK64
    return h


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, name: str) -> int:
    return splitmix64((seed ^ splitmix64(fnv1a64(name.encode()))) & MASK64)


def generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, name))


def snake(name: str) -> str:
    """proto JSON field names (lowerCamelCase) -> proto names."""
    out = []
    for c in name:
        if c.isupper():
            out.append("_" + c.lower())
        else:
            out.append(c)
    return "".join(out)


@contextlib.contextmanager
def one_thread():
    """LAPACK's QR (MKL) differs in the last bits between thread counts; the
    service runs it on one thread, so the orthogonal reference does too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def gain_value(gain) -> float:
    """A Gain message (as a dict) -> the gain torch.nn.init is called with."""
    gain = {snake(k): v for k, v in (gain or {}).items()}
    if "value" in gain:
        return gain["value"]
    if "nonlinearity" in gain:
        return torch.nn.init.calculate_gain(gain["nonlinearity"], gain.get("param"))
    return 1.0


def rope_inv_freq(base: float = 10000.0, dim: int = 0, scaling=None) -> torch.Tensor:
    """RoPE inverse frequencies (float32), written exactly like Hugging Face
    transformers' rope init functions (docs/init.md quotes this)."""
    scaling = {snake(k): v for k, v in (scaling or {}).items()}
    kind = scaling.get("type") or "default"
    factor = scaling.get("factor", 0.0)

    def default(base):
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    if kind in ("default", "dynamic"):
        return default(base)
    if kind == "linear":
        inv_freq = default(base)
        inv_freq /= factor
        return inv_freq
    if kind == "llama3":
        inv_freq = default(base)
        low_freq_factor = scaling.get("low_freq_factor", 1.0)
        high_freq_factor = scaling.get("high_freq_factor", 4.0)
        old_context_len = int(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    if kind == "yarn":
        beta_fast = scaling.get("beta_fast", 32.0)
        beta_slow = scaling.get("beta_slow", 1.0)
        original = int(scaling["original_max_position_embeddings"])

        def find_correction_dim(num_rotations):
            return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(find_correction_dim(beta_fast)), 0)
        high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (factor * pos_freqs)
        inv_freq_extrapolation_factor = 1 - ramp
        return (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
                + inv_freq_extrapolation * inv_freq_extrapolation_factor)
    raise ValueError(f"unknown RoPE scaling {kind}")


def reference(shape, dtype: torch.dtype, scheme: str, params: dict,
              seed: int, name: str) -> torch.Tensor:
    """What RNG_MODE_TORCH must produce for one tensor, bit for bit: the
    Python expressions of docs/init.md. `scheme` and `params` are the
    InitScheme oneof case and its fields (proto or JSON names)."""
    shape = list(shape)
    scheme = snake(scheme)
    params = {snake(k): v for k, v in (params or {}).items()}
    n = numel(shape)
    if scheme == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if scheme == "ones":
        return torch.ones(shape, dtype=dtype)
    if scheme == "constant":
        return torch.full(shape, params.get("val", 0.0), dtype=dtype)
    if scheme == "empty":
        return torch.zeros(shape, dtype=dtype)  # fresh pages (CPU)
    if scheme == "arange":
        start, step = params.get("start", 0.0), params.get("step", 1.0)
        if dtype.is_floating_point:
            values = torch.arange(n, dtype=torch.float64) * step + start
        else:
            values = torch.arange(n, dtype=torch.int64) * int(step) + int(start)
        return values.to(dtype).reshape(shape)
    if scheme == "rope_inv_freq":
        dim = params.get("dim", 2 * shape[0])
        return rope_inv_freq(params.get("base", 10000.0), dim,
                             params.get("scaling")).to(dtype)
    wide = dtype in FLOAT8 or (scheme == "orthogonal" and dtype in (torch.float16, torch.bfloat16))
    t = torch.empty(shape, dtype=torch.float32 if wide else dtype)
    if n == 0:
        return t.to(dtype)
    if scheme == "eye":
        torch.nn.init.eye_(t)
        return t.to(dtype)
    if scheme == "dirac":
        torch.nn.init.dirac_(t, params.get("groups", 1))
        return t.to(dtype)
    d = derive_seed(seed, name)
    g = torch.Generator().manual_seed(d)
    init = torch.nn.init
    if scheme == "normal":
        t.normal_(params.get("mean", 0.0), params.get("std", 1.0), generator=g)
    elif scheme == "uniform":
        t.uniform_(params.get("a", 0.0), params.get("b", 1.0), generator=g)
    elif scheme == "trunc_normal":
        init.trunc_normal_(t, params.get("mean", 0.0), params.get("std", 1.0),
                           params.get("a", -2.0), params.get("b", 2.0), generator=g)
    elif scheme in ("xavier_uniform", "xavier_normal"):
        fn = init.xavier_uniform_ if scheme == "xavier_uniform" else init.xavier_normal_
        fn(t, gain=gain_value(params.get("gain")), generator=g)
    elif scheme in ("kaiming_uniform", "kaiming_normal"):
        fn = init.kaiming_uniform_ if scheme == "kaiming_uniform" else init.kaiming_normal_
        fn(t, a=params.get("a", 0), mode=params.get("mode") or "fan_in",
           nonlinearity=params.get("nonlinearity") or "leaky_relu", generator=g)
    elif scheme == "orthogonal":
        with one_thread():
            init.orthogonal_(t, gain=gain_value(params.get("gain")), generator=g)
    elif scheme == "sparse":
        torch.manual_seed(d)  # sparse_ draws torch.randperm from the default generator
        init.sparse_(t, params.get("sparsity", 0.0), params.get("std", 0.01), generator=g)
    else:
        raise ValueError(f"unknown scheme {scheme}")
    return t.to(dtype)


def reset_module(module, seed: int, name: str) -> None:
    """module_default's reference: the module's own reset with the global
    generator seeded from its name. MultiheadAttention: out_proj (its own
    Linear) first, then MultiheadAttention._reset_parameters, which zeroes
    out_proj.bias."""
    if isinstance(module, torch.nn.MultiheadAttention):
        out_name = f"{name}.out_proj" if name else "out_proj"
        torch.manual_seed(derive_seed(seed, out_name))
        module.out_proj.reset_parameters()
        torch.manual_seed(derive_seed(seed, name))
        module._reset_parameters()
        return
    torch.manual_seed(derive_seed(seed, name))
    module.reset_parameters()


def load_safetensors(blob: bytes) -> dict:
    import safetensors.torch
    return safetensors.torch.load(blob)


def glob_match(pattern: str, name: str) -> bool:
    """The API's glob: * (any run, dots included), ?, [abc], [a-z], [!abc]."""
    import fnmatch
    return fnmatch.fnmatchcase(name, pattern)


def portable_reference(shape, dtype_name: str, scheme: str, params: dict,
                       seed: int, name: str) -> torch.Tensor:
    """RNG_MODE_PORTABLE's values for the schemes examples use (from the
    NumPy reference, tests/python/portable_ref.py)."""
    import numpy as np
    import portable_ref
    dtype = TORCH_DTYPES[dtype_name]
    if scheme in ("zeros", "ones", "constant"):
        value = {"zeros": 0.0, "ones": 1.0}.get(scheme, params.get("val"))
        return torch.full(list(shape), value, dtype=dtype)
    if scheme == "uniform":
        dist, p = "uniform", {"a": params.get("a", 0.0), "b": params.get("b", 1.0)}
    elif scheme == "normal":
        dist, p = "normal", {"mean": params.get("mean", 0.0),
                             "std": params.get("std", 1.0)}
    else:
        raise ValueError(f"no portable reference here for {scheme}")
    bits = np.ascontiguousarray(
        portable_ref.fill(seed, name, dtype_name, dist, p, list(shape)))
    return torch.frombuffer(bytearray(bits.tobytes()),
                            dtype=dtype).reshape(list(shape))


def tie_root(model_json: dict, name: str) -> str:
    """The tensor `name` shares storage with (itself if not tied)."""
    by_name = {t["name"]: t for t in model_json["tensors"]}
    while by_name[name].get("tieTo"):
        name = by_name[name]["tieTo"]
    return name


def resolve_inits(model_json: dict) -> dict:
    """name -> (scheme, params) following the API's precedence rules. A tied
    tensor gets its root's (its values are the root's: seed with the root's
    name, see tie_root)."""
    out = {}
    rules = model_json.get("initRules", [])
    for t in model_json["tensors"]:
        if t.get("tieTo"):
            continue
        init = t.get("init")
        if init is None:
            for r in rules:
                if glob_match(r["pattern"], t["name"]):
                    init = r["init"]
                    break
        if init is None:
            raise ValueError(f"{t['name']} is not covered")
        (scheme, params), = init.items()
        out[t["name"]] = (scheme, params)
    for t in model_json["tensors"]:
        if t.get("tieTo"):
            out[t["name"]] = out[tie_root(model_json, t["name"])]
    return out


def load_json(name: str) -> dict:
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
        return json.load(f)


def numel(shape) -> int:
    return math.prod(int(s) for s in shape)


def safetensors_header(blob: bytes):
    """(header dict, data start offset) of a safetensors file's bytes."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    return header, 8 + n


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (for bit-for-bit comparison; works for 0-d
    tensors, -0.0 and NaN)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def meminfo_bytes(key: str) -> int:
    """A /proc/meminfo line ("Shmem", "ShmemHugePages", ...) in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/meminfo")


def materialize_describe_fetch(server, request_text, client):
    """Materialize the request (MaterializeRequest as JSON text) as
    `client`; returns the response, Describe's answer and the safetensors
    file of every tensor (non-persistent ones included), with the handle
    released and the client idle."""
    resp = server.materialize(server.parse_request(request_text), client)
    try:
        info = server.describe(resp.handle, client)
        blob = server.fetch(resp.handle, client, include_non_persistent=True)
    finally:
        server.release(resp.handle, client)
    server.assert_idle(client=client)
    return resp, info, blob


def materialize_from_checkpoint(server, model_spec, checkpoint, client):
    """Materialize `model_spec` (JSON dict) with `checkpoint` (a
    CheckpointSource as a JSON dict) as `client`; returns the response,
    Describe's answer and the handle's tensors (fetched with the
    non-persistent ones), with the handle released and the client idle."""
    req = {"model": model_spec, "checkpoint": checkpoint}
    resp, info, blob = materialize_describe_fetch(server, json.dumps(req), client)
    return resp, info, load_safetensors(blob)
