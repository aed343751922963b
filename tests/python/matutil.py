"""Helpers shared by the Python tests: seeds, request files, references."""

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


def reference(shape, dtype: torch.dtype, scheme: str, params: dict,
              seed: int, name: str) -> torch.Tensor:
    """What RNG_MODE_TORCH must produce for one tensor, bit for bit."""
    shape = list(shape)
    if scheme == "zeros":
        return torch.zeros(shape, dtype=dtype)
    if scheme == "ones":
        return torch.ones(shape, dtype=dtype)
    if scheme == "constant":
        return torch.full(shape, params.get("val", 0.0), dtype=dtype)
    gen_dtype = torch.float32 if dtype in FLOAT8 else dtype
    t = torch.empty(shape, dtype=gen_dtype)
    g = generator(seed, name)
    if scheme == "normal":
        t.normal_(params.get("mean", 0.0), params.get("std", 1.0), generator=g)
    elif scheme == "uniform":
        t.uniform_(params.get("a", 0.0), params.get("b", 1.0), generator=g)
    else:
        raise ValueError(f"unknown scheme {scheme}")
    return t.to(dtype)


def glob_match(pattern: str, name: str) -> bool:
    """The API's glob: * (any run, dots included), ?, [abc], [a-z], [!abc]."""
    import fnmatch
    return fnmatch.fnmatchcase(name, pattern)


def resolve_inits(model_json: dict) -> dict:
    """name -> (scheme, params) following the API's precedence rules."""
    out = {}
    rules = model_json.get("initRules", [])
    for t in model_json["tensors"]:
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
