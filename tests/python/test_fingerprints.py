"""Describe's fingerprints: per tensor and per handle, recomputed here from
the fetched bytes by the definition in docs/delivery.md, equal across runs,
different when a value moves, and additive over shards, so ranks holding
the shards of one model can check it against the full model with one
number each."""

import json
import os
import sys

import numpy as np
import safetensors.torch

import matutil as m

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "python"))
from materializer import fingerprint as client_fp  # noqa: E402

SEED = 77
MASK = (1 << 64) - 1
RULES = [{"pattern": "*.bias", "init": {"uniform": {"a": -1, "b": 1}}},
         {"pattern": "*", "init": {"normal": {"std": 0.5}}}]
ITEM = {"F32": np.uint32, "BF16": np.uint16, "I64": np.uint64}


def splitmix64(x):
    """Vectorized SplitMix64 output function on uint64 arrays (wrapping)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fingerprint(raw: bytes, st_dtype, shape, full_shape=None, offset=None):
    """The definition: sum mod 2^64 of SplitMix64(g ^ SplitMix64(bits)) with
    g the element's row-major index in the full tensor."""
    full_shape = full_shape or shape
    offset = offset or [0] * len(shape)
    bits = np.frombuffer(raw, dtype=ITEM[st_dtype]).astype(np.uint64)
    grids = np.meshgrid(*[np.arange(o, o + n, dtype=np.uint64)
                          for o, n in zip(offset, shape)], indexing="ij")
    g = np.zeros(shape, dtype=np.uint64)
    stride = np.uint64(1)
    for d in reversed(range(len(shape))):
        g += grids[d] * stride
        stride *= np.uint64(full_shape[d])
    with np.errstate(over="ignore"):
        terms = splitmix64(g.reshape(-1) ^ splitmix64(bits))
    return int(sum(int(t) for t in terms)) & MASK


def model(tensors, seed=SEED):
    return {"model": {"tensors": tensors, "initRules": RULES,
                      "seed": str(seed)}}


def materialize(server, req, client="fp"):
    resp = server.materialize(server.parse_request(json.dumps(req)), client)
    info = server.describe(resp.handle, client)
    blob = server.fetch(resp.handle, client)
    server.release(resp.handle, client)
    return info, blob


def test_fingerprints_follow_the_definition(server):
    tensors = [{"name": "l.weight", "shape": [23, 17], "dtype": "float32"},
               {"name": "l.bias", "shape": [17], "dtype": "bfloat16"},
               {"name": "pos", "shape": [5], "dtype": "int64",
                "init": {"arange": {"start": 3}}},
               {"name": "head.weight", "shape": [23, 17], "dtype": "float32",
                "tieTo": "l.weight"}]
    info, blob = materialize(server, model(tensors))
    header, start = m.safetensors_header(blob)
    by_name = {t.name: t for t in info.tensors}
    handle_sum = 0
    for name, h in header.items():
        if name == "__metadata__":
            continue
        raw = blob[start + h["data_offsets"][0]:start + h["data_offsets"][1]]
        want = fingerprint(raw, h["dtype"], h["shape"])
        assert by_name[name].fingerprint == want, name
        if name != "head.weight":
            handle_sum += want * (m.fnv1a64(name.encode()) | 1)
    # The tie repeats its root's fingerprint and is not counted twice.
    assert by_name["head.weight"].fingerprint == by_name["l.weight"].fingerprint
    assert info.fingerprint == handle_sum & MASK
    # The trainer-side helper agrees, from loaded tensors.
    loaded = safetensors.torch.load(blob)
    for name, tensor in loaded.items():
        assert client_fp.of_tensor(tensor) == by_name[name].fingerprint, name
    assert client_fp.of_handle({n: by_name[n].fingerprint for n in loaded
                                if n != "head.weight"}) == info.fingerprint
    # Same request, same fingerprints; another seed changes them.
    again, _ = materialize(server, model(tensors))
    assert [t.fingerprint for t in again.tensors] == \
        [t.fingerprint for t in info.tensors]
    assert again.fingerprint == info.fingerprint
    other, _ = materialize(server, model(tensors, seed=SEED + 1))
    assert other.tensors[0].fingerprint != info.tensors[0].fingerprint
    # arange does not depend on the seed.
    assert other.tensors[2].fingerprint == info.tensors[2].fingerprint
    server.assert_idle()


def test_shard_fingerprints_add_up_to_the_full_model(server):
    shape = [37, 130]
    full_tensors = [{"name": "w", "shape": shape, "dtype": "float32"},
                    {"name": "v.bias", "shape": [130], "dtype": "bfloat16"}]
    full, _ = materialize(server, model(full_tensors))
    layouts = {
        "rows of 4": [{"split": {"dim": 0, "index": i, "count": 4}}
                      for i in range(4)],
        "columns of 3": [{"split": {"dim": 1, "index": i, "count": 3}}
                         for i in range(3)],
        "2-D blocks": [{"box": [{"offset": r0, "length": r1 - r0},
                                {"offset": c0, "length": c1 - c0}]}
                       for r0, r1 in ((0, 20), (20, 37))
                       for c0, c1 in ((0, 64), (64, 130))],
    }
    for layout, shards in layouts.items():
        tensor_sum, handle_values = 0, []
        for k, shard in enumerate(shards):
            # One handle per "rank": its shard of w, and the bias on rank 0.
            tensors = [{"name": "w", "shape": shape, "dtype": "float32",
                        "shard": shard}]
            if k == 0:
                tensors.append(full_tensors[1])
            info, blob = materialize(server, model(tensors))
            t = info.tensors[0]
            header, start = m.safetensors_header(blob)
            h = header["w"]
            raw = blob[start + h["data_offsets"][0]:
                       start + h["data_offsets"][1]]
            assert t.fingerprint == fingerprint(
                raw, "F32", list(t.shape), list(t.full_shape),
                list(t.shard_offset)), (layout, k)
            assert client_fp.of_bytes(raw, 4, list(t.shape),
                                      list(t.full_shape),
                                      list(t.shard_offset)) == t.fingerprint
            tensor_sum += t.fingerprint
            handle_values.append(info.fingerprint)
        assert tensor_sum & MASK == full.tensors[0].fingerprint, layout
        assert client_fp.combine(handle_values) == full.fingerprint, layout
    server.assert_idle()
