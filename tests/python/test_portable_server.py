"""RNG_MODE_PORTABLE through the server: the bytes equal the NumPy reference
(tests/python/portable_ref.py, the executable form of docs/portable-rng.md),
for the full tensor and for any shard, whatever the order of the request."""

import json
import math

import grpc
import numpy as np
import pytest

import matutil as m
import portable_ref as ref

SEED = 20261130


def request(tensors, rules, seed=SEED, rng=None):
    model = {"tensors": tensors, "initRules": rules, "seed": str(seed)}
    if rng:
        model["rng"] = rng
    return {"model": model}


def materialize_bytes(server, req, client="portable"):
    """{name: raw bytes} of every tensor of the request."""
    resp = server.materialize(server.parse_request(json.dumps(req)), client)
    try:
        assert server.describe(resp.handle, client).rng == \
            server.pb.RNG_MODE_PORTABLE
        blob = server.fetch(resp.handle, client)
    finally:
        server.release(resp.handle, client)
    header, start = m.safetensors_header(blob)
    header.pop("__metadata__", None)
    return {n: blob[start + h["data_offsets"][0]:start + h["data_offsets"][1]]
            for n, h in header.items()}


def ref_bytes(name, dtype, dist, params, shape, box=None):
    return np.ascontiguousarray(
        ref.fill(SEED, name, dtype, dist, params, shape, box)).tobytes()


def fans(shape):
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


CASES = [
    # (scheme JSON, (reference distribution, params) for a given shape)
    ({"uniform": {"a": -0.5, "b": 2.0}},
     lambda s: ("uniform", {"a": -0.5, "b": 2.0})),
    ({"normal": {"mean": 0.25, "std": 0.02}},
     lambda s: ("normal", {"mean": 0.25, "std": 0.02})),
    ({"truncNormal": {"std": 0.02, "a": -0.04, "b": 0.04}},
     lambda s: ("trunc_normal", {"mean": 0.0, "std": 0.02, "a": -0.04,
                                 "b": 0.04})),
    ({"xavierUniform": {"gain": {"nonlinearity": "relu"}}},
     lambda s: ("uniform", (lambda b: {"a": -b, "b": b})(
         math.sqrt(3.0) * (math.sqrt(2.0) * math.sqrt(2.0 / float(sum(fans(s)))))))),
    ({"kaimingNormal": {"mode": "fan_out", "nonlinearity": "relu"}},
     lambda s: ("normal", {"mean": 0.0,
                           "std": math.sqrt(2.0) / math.sqrt(fans(s)[1])})),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16",
                                   "float8_e4m3fn", "float64"])
def test_server_equals_the_reference(server, dtype):
    shapes = {"t.vec": [1000], "t.mat": [37, 129], "t.conv": [8, 3, 5, 5]}
    for k, (scheme, dist_of) in enumerate(CASES):
        needs_fans = "xavierUniform" in scheme or "kaimingNormal" in scheme
        tensors = [{"name": f"{n}.{k}", "shape": s, "dtype": dtype}
                   for n, s in shapes.items() if len(s) >= 2 or not needs_fans]
        got = materialize_bytes(server, request(
            tensors, [{"pattern": "*", "init": scheme}]))
        for t in tensors:
            dist, params = dist_of(t["shape"])
            want = ref_bytes(t["name"], dtype, dist, params, t["shape"])
            assert got[t["name"]] == want, (t["name"], scheme, dtype)


SHARD_LAYOUTS = {
    "rows": (0, 4),       # split dim 0 into 4 (uneven: 37 rows)
    "columns": (1, 3),    # split dim 1 into 3
}


def test_shards_concatenate_to_the_full_tensor(server):
    shape = [37, 130]
    rule = [{"pattern": "*", "init": {"normal": {"std": 1.0}}}]
    full = np.frombuffer(materialize_bytes(server, request(
        [{"name": "w", "shape": shape, "dtype": "float32"}], rule))["w"],
        dtype=np.float32).reshape(shape)
    for layout, (dim, count) in SHARD_LAYOUTS.items():
        pieces = []
        for index in range(count):
            shard = {"split": {"dim": dim, "index": index, "count": count}}
            got = materialize_bytes(server, request(
                [{"name": "w", "shape": shape, "dtype": "float32",
                  "shard": shard}], rule))["w"]
            pieces.append(np.frombuffer(got, dtype=np.float32))
        parts = [p.reshape([-1, shape[1]] if dim == 0 else [shape[0], -1])
                 for p in pieces]
        assert np.array_equal(np.concatenate(parts, axis=dim), full), layout
    # 2-D blocks, with an explicit box each, and an uneven last block.
    blocks = np.zeros(shape, dtype=np.float32)
    for r0, r1 in ((0, 20), (20, 37)):
        for c0, c1 in ((0, 64), (64, 130)):
            box = [{"offset": r0, "length": r1 - r0},
                   {"offset": c0, "length": c1 - c0}]
            got = materialize_bytes(server, request(
                [{"name": "w", "shape": shape, "dtype": "float32",
                  "shard": {"box": box}}], rule))["w"]
            blocks[r0:r1, c0:c1] = np.frombuffer(got, dtype=np.float32).reshape(
                r1 - r0, c1 - c0)
    assert np.array_equal(blocks, full)


def test_order_and_subset_do_not_change_values(server):
    rule = [{"pattern": "*", "init": {"uniform": {"a": -1, "b": 1}}}]
    tensors = [{"name": f"layer.{i}.w", "shape": [16, 33], "dtype": "bfloat16"}
               for i in range(6)]
    base = materialize_bytes(server, request(tensors, rule))
    shuffled = materialize_bytes(server, request(tensors[::-1], rule))
    subset = materialize_bytes(server, request(tensors[2:4], rule))
    assert shuffled == base
    assert all(subset[n] == base[n] for n in subset)


def test_plan_and_describe_report_the_shard(server):
    pb = server.pb
    req = request([{"name": "w", "shape": [10, 8], "dtype": "float32",
                    "shard": {"split": {"dim": 0, "index": 3, "count": 4}}}],
                  [{"pattern": "*", "init": {"zeros": {}}}])
    plan = server.stub.Plan(server.parse_request(json.dumps(req),
                                                 pb.PlanRequest), timeout=30)
    t = plan.tensors[0]
    # torch.chunk: 10 rows in 4 parts of 3 -> the last part has 1 row.
    assert list(t.shape) == [1, 8] and t.nbytes == 32
    assert list(t.full_shape) == [10, 8] and list(t.shard_offset) == [9, 0]
    resp = server.materialize(server.parse_request(json.dumps(req)))
    info = server.describe(resp.handle)
    assert list(info.tensors[0].full_shape) == [10, 8]
    assert list(info.tensors[0].shard_offset) == [9, 0]
    server.release(resp.handle)
    server.assert_idle()


@pytest.mark.parametrize("case,fragment", [
    ({"rng": "RNG_MODE_TORCH", "shard": {"split": {"dim": 0, "index": 0, "count": 2}}},
     "shards need RNG_MODE_PORTABLE"),
    ({"shard": {"split": {"dim": 2, "index": 0, "count": 2}}}, "dim 2"),
    ({"shard": {"split": {"dim": 0, "index": 2, "count": 2}}}, "index 2"),
    ({"shard": {"box": [{"offset": 0, "length": 9}]}}, "1 ranges"),
    ({"shard": {"box": [{"offset": 5, "length": 9}, {"offset": 0, "length": 8}]}},
     ""),
    ({"init": {"orthogonal": {}}}, "no portable definition"),
])
def test_bad_shards_and_unportable_schemes(server, case, fragment):
    tensor = {"name": "w", "shape": [10, 8], "dtype": "float32"}
    rng = case.get("rng")
    tensor.update({k: v for k, v in case.items() if k != "rng"})
    req = request([tensor], [{"pattern": "*", "init": {"zeros": {}}}], rng=rng)
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)), "bad-shard")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert '"w"' in e.value.details()
    assert fragment in e.value.details()
    server.assert_idle(client="bad-shard")
