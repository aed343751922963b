"""Init steps (TensorSpec.init_steps) and literal values through the server.

Torch mode: a tensor's bytes equal, bit for bit, the recorded calls run
in-process on the views t[region] with the tensor's one generator
(docs/init.md, "Init steps"). Portable mode: the bytes equal the NumPy
reference (portable_ref.fill_steps, docs/portable-rng.md), for the full
tensor and for shards. Plan and Describe show the steps; bad steps are
refused naming the tensor, with nothing held afterwards."""

import json
import math

import grpc
import numpy as np
import pytest
import torch

import matutil as m
import portable_ref as ref

SEED = 4242
init = torch.nn.init


def region_json(offset, length):
    return [{"offset": o, "length": n} for o, n in zip(offset, length)]


def view(t, region):
    """t[o0:o0+l0, o1:o1+l1, ...]"""
    if region is None:
        return t
    offset, length = region
    return t[tuple(slice(o, o + n) for o, n in zip(offset, length))]


def values_json(array):
    import base64
    data = np.ascontiguousarray(array).tobytes()
    return {"values": {"data": base64.b64encode(data).decode()}}


def materialize(server, tensors, rng="RNG_MODE_TORCH", client="steps"):
    """{name: bytes} of every tensor, and the Plan and Describe answers."""
    req = {"model": {"tensors": tensors, "seed": str(SEED), "rng": rng}}
    text = json.dumps(req)
    plan = server.stub.Plan(server.parse_request(text, server.pb.PlanRequest),
                            metadata=server.md(client), timeout=60)
    _, info, blob = m.materialize_describe_fetch(server, text, client)
    header, start = m.safetensors_header(blob)
    header.pop("__metadata__", None)
    got = {n: blob[start + h["data_offsets"][0]:start + h["data_offsets"][1]]
           for n, h in header.items()}
    return got, plan, info


def tensor_bytes(t):
    return m.bits(t).numpy().tobytes()


# --------------------------------------------------------------- torch ----

def test_padding_row_zeroed_after_normal(server):
    """nn.Embedding(12, 8, padding_idx=3) as a Hugging Face _init_weights
    records it: weight.normal_(0, 0.02), then weight[3].zero_()."""
    tensors = [{"name": "embed.weight", "shape": [12, 8], "dtype": "float32",
                "initSteps": [
                    {"init": {"normal": {"std": 0.02}}},
                    {"init": {"zeros": {}},
                     "region": region_json((3, 0), (1, 8))}]}]
    got, _, _ = materialize(server, tensors)
    g = m.generator(SEED, "embed.weight")
    t = torch.empty(12, 8)
    init.normal_(t, 0.0, 0.02, generator=g)
    init.zeros_(t[3:4, 0:8])
    assert got["embed.weight"] == tensor_bytes(t)
    assert not torch.frombuffer(bytearray(got["embed.weight"]),
                                dtype=torch.float32).reshape(12, 8)[3].any()


# (scheme JSON, region, the call on the view with generator g)
OVERLAPPING = [
    ({"uniform": {"a": -0.1, "b": 0.1}}, None,
     lambda v, g: init.uniform_(v, -0.1, 0.1, generator=g)),
    ({"xavierUniform": {"gain": {"nonlinearity": "relu"}}}, ((0, 2), (4, 6)),
     lambda v, g: init.xavier_uniform_(v, gain=init.calculate_gain("relu"),
                                       generator=g)),
    ({"normal": {"mean": 1.0, "std": 0.5}}, ((2, 0), (4, 5)),
     lambda v, g: init.normal_(v, 1.0, 0.5, generator=g)),
    ({"truncNormal": {"std": 0.02}}, ((5, 0), (1, 8)),
     lambda v, g: init.trunc_normal_(v, 0.0, 0.02, generator=g)),
    ({"kaimingNormal": {"mode": "fan_out", "nonlinearity": "relu"}},
     ((6, 1), (6, 7)),
     lambda v, g: init.kaiming_normal_(v, mode="fan_out", nonlinearity="relu",
                                       generator=g)),
    ({"constant": {"val": 0.5}}, ((0, 0), (1, 1)),
     lambda v, g: init.constant_(v, 0.5)),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16",
                                   "float64"])
def test_overlapping_steps_equal_the_calls_on_views(server, dtype):
    """Later steps win where regions overlap; fan-based schemes take the
    region's fans; every step draws from the one generator, in order."""
    steps = [{"init": s} if r is None else
             {"init": s, "region": region_json(*r)}
             for s, r, _ in OVERLAPPING]
    name = f"w.{dtype}"
    got, _, _ = materialize(server, [{"name": name, "shape": [12, 8],
                                      "dtype": dtype, "initSteps": steps}])
    g = m.generator(SEED, name)
    t = torch.empty(12, 8, dtype=m.TORCH_DTYPES[dtype])
    for _, region, call in OVERLAPPING:
        call(view(t, region), g)
    assert got[name] == tensor_bytes(t), dtype


def test_float8_steps_go_through_float32(server):
    """float8 has no kernels: a step fills a float32 tensor of its region's
    shape and is rounded into place (docs/init.md)."""
    name = "f8"
    steps = [{"init": {"normal": {"std": 2.0}}},
             {"init": {"uniform": {"a": -3, "b": 3}},
              "region": region_json((1, 2), (3, 2))}]
    got, _, _ = materialize(server, [{"name": name, "shape": [5, 6],
                                      "dtype": "float8_e4m3fn",
                                      "initSteps": steps}])
    g = m.generator(SEED, name)
    t = torch.empty(5, 6, dtype=torch.float8_e4m3fn)
    t.copy_(init.normal_(torch.empty(5, 6), 0.0, 2.0, generator=g))
    t[1:4, 2:4].copy_(init.uniform_(torch.empty(3, 2), -3, 3, generator=g))
    assert got[name] == tensor_bytes(t)


def test_matrix_schemes_and_computed_buffers_on_regions(server):
    d = m.derive_seed(SEED, "mix")
    tensors = [
        {"name": "mix", "shape": [8, 6], "dtype": "float32", "initSteps": [
            {"init": {"zeros": {}}},
            {"init": {"orthogonal": {"gain": {"value": 2.0}}},
             "region": region_json((2, 0), (4, 6))},
            {"init": {"sparse": {"sparsity": 0.5, "std": 0.3}},
             "region": region_json((0, 1), (8, 3))},
            {"init": {"eye": {}}, "region": region_json((5, 2), (3, 3))},
        ]},
        {"name": "ids", "shape": [3, 5], "dtype": "int32", "initSteps": [
            {"init": {"constant": {"val": -1}}},
            {"init": {"arange": {"start": 5, "step": 2}},
             "region": region_json((1, 1), (2, 4))},
        ]},
        {"name": "conv", "shape": [4, 2, 3], "dtype": "bfloat16", "initSteps": [
            {"init": {"ones": {}}},
            {"init": {"dirac": {}}, "region": region_json((2, 0, 0), (2, 2, 3))},
        ]},
    ]
    got, _, _ = materialize(server, tensors)
    g = torch.Generator().manual_seed(d)
    torch.manual_seed(d)  # sparse_'s permutations (docs/init.md)
    t = torch.empty(8, 6)
    init.zeros_(t)
    with m.one_thread():
        init.orthogonal_(t[2:6, 0:6], gain=2.0, generator=g)
    init.sparse_(t[0:8, 1:4], 0.5, 0.3, generator=g)
    init.eye_(t[5:8, 2:5])
    assert got["mix"] == tensor_bytes(t)

    ids = torch.full((3, 5), -1, dtype=torch.int32)
    ids[1:3, 1:5].copy_((torch.arange(8, dtype=torch.int64) * 2 + 5)
                        .to(torch.int32).reshape(2, 4))
    assert got["ids"] == tensor_bytes(ids)

    conv = torch.ones(4, 2, 3, dtype=torch.bfloat16)
    init.dirac_(conv[2:4, 0:2, 0:3])
    assert got["conv"] == tensor_bytes(conv)


def test_values_steps_copy_the_bytes_in(server):
    """inv_freq computed on the client and copied in; a -inf mask; a values
    step over a region of a drawn tensor."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    mask = torch.full((4, 4), float("-inf"), dtype=torch.float16).triu(1)
    corner = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    tensors = [
        {"name": "rope.inv_freq", "shape": [8], "dtype": "float32",
         "kind": "TENSOR_KIND_BUFFER", "persistent": False,
         "init": values_json(inv_freq.numpy())},
        {"name": "mask", "shape": [4, 4], "dtype": "float16",
         "kind": "TENSOR_KIND_BUFFER",
         "init": values_json(mask.view(torch.int16).numpy())},
        {"name": "w", "shape": [4, 5], "dtype": "float32", "initSteps": [
            {"init": {"normal": {}}},
            {"init": values_json(corner), "region": region_json((1, 2), (2, 3))},
        ]},
    ]
    got, _, _ = materialize(server, tensors)
    assert got["rope.inv_freq"] == tensor_bytes(inv_freq)
    assert got["mask"] == tensor_bytes(mask)
    g = m.generator(SEED, "w")
    w = init.normal_(torch.empty(4, 5), generator=g)
    w[1:3, 2:5].copy_(torch.from_numpy(corner))
    assert got["w"] == tensor_bytes(w)


def test_one_step_without_a_region_is_the_plain_init(server):
    scheme = {"kaimingUniform": {"a": math.sqrt(5)}}
    plain, _, _ = materialize(server, [{"name": "w", "shape": [7, 9],
                                        "dtype": "bfloat16", "init": scheme}])
    step, _, _ = materialize(server, [{"name": "w", "shape": [7, 9],
                                       "dtype": "bfloat16",
                                       "initSteps": [{"init": scheme}]}])
    assert plain == step


def test_plan_and_describe_show_the_steps(server):
    tensors = [
        {"name": "emb.weight", "shape": [12, 8], "dtype": "float32",
         "initSteps": [{"init": {"normal": {"std": 0.02}}},
                       {"init": {"zeros": {}},
                        "region": region_json((3, 0), (1, 8))}]},
        {"name": "head.weight", "shape": [12, 8], "dtype": "float32",
         "tieTo": "emb.weight"},
        {"name": "bias", "shape": [8], "dtype": "float32",
         "init": {"ones": {}}},
        {"name": "buf", "shape": [2], "dtype": "float32",
         "init": values_json(np.array([1, 2], dtype=np.float32))},
    ]
    _, plan, info = materialize(server, tensors)
    for listing in (plan.tensors, info.tensors):
        emb, head, bias, buf = listing
        assert emb.init == ("normal(mean=0, std=0.02) then zeros on "
                            "[3:4, 0:8] [tensor init_steps]")
        assert [s.init for s in emb.steps] == ["normal(mean=0, std=0.02)",
                                               "zeros"]
        assert list(emb.steps[0].region) == []
        assert [(r.offset, r.length) for r in emb.steps[1].region] == \
            [(3, 1), (0, 8)]
        assert head.init == "tied to emb.weight" and len(head.steps) == 0
        assert [s.init for s in bias.steps] == ["ones"]
        assert bias.init == "ones [tensor init]"
        assert [s.init for s in buf.steps] == ["values(8 bytes)"]


# ------------------------------------------------------------ portable ----

def portable_steps(dtype):
    """Steps for a [9, 13] tensor and their reference form."""
    steps = [
        ({"normal": {"std": 0.5}}, None, ("normal", {"mean": 0.0, "std": 0.5})),
        ({"uniform": {"a": 2, "b": 3}}, ((1, 3), (4, 9)),
         ("uniform", {"a": 2.0, "b": 3.0})),
        ({"truncNormal": {"mean": -1, "std": 0.25}}, ((4, 0), (3, 13)),
         ("trunc_normal", {"mean": -1.0, "std": 0.25, "a": -2.0, "b": 2.0})),
        ({"xavierUniform": {}}, ((0, 10), (9, 3)),
         # the region's fans: fan_in 3, fan_out 9
         ("uniform", (lambda b: {"a": -b, "b": b})(
             math.sqrt(3.0) * math.sqrt(2.0 / 12.0)))),
        ({"zeros": {}}, ((2, 0), (1, 13)), ("constant", {"value": 0.0})),
    ]
    wire = [{"init": s} if r is None else {"init": s, "region": region_json(*r)}
            for s, r, _ in steps]
    reference = [{"dist": d, "params": p, "region": r}
                 for _, r, (d, p) in steps]
    return wire, reference


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_portable_steps_equal_the_reference_for_shards(server, dtype):
    shape = [9, 13]
    wire, reference = portable_steps(dtype)

    def shard_bytes(shard=None):
        t = {"name": "w", "shape": shape, "dtype": dtype, "initSteps": wire}
        if shard is not None:
            t["shard"] = shard
        got, _, _ = materialize(server, [t], rng="RNG_MODE_PORTABLE")
        return got["w"]

    def want(box=None):
        return np.ascontiguousarray(ref.fill_steps(
            SEED, "w", dtype, shape, reference, box)).tobytes()

    assert shard_bytes() == want()
    layouts = [
        # rows, columns (uneven), a 2-D block, an empty shard
        ({"split": {"dim": 0, "index": 1, "count": 3}}, ((3, 0), (3, 13))),
        ({"split": {"dim": 1, "index": 2, "count": 3}}, ((0, 10), (9, 3))),
        ({"box": region_json((2, 4), (5, 6))}, ((2, 4), (5, 6))),
        ({"split": {"dim": 0, "index": 9, "count": 10}}, ((9, 0), (0, 13))),
    ]
    for shard, box in layouts:
        assert shard_bytes(shard) == want(box), (dtype, shard)


def test_portable_values_step_takes_the_shards_part(server):
    corner = (np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5)
    wire = [{"init": {"normal": {}}},
            {"init": values_json(corner), "region": region_json((4, 1), (3, 4))}]
    reference = [{"dist": "normal", "params": {"mean": 0.0, "std": 1.0}},
                 {"bits": corner, "region": ((4, 1), (3, 4))}]
    for shard, box in [(None, None),
                       ({"split": {"dim": 0, "index": 1, "count": 2}},
                        ((4, 0), (4, 6)))]:
        t = {"name": "v", "shape": [8, 6], "dtype": "float32",
             "initSteps": wire}
        if shard:
            t["shard"] = shard
        got, _, _ = materialize(server, [t], rng="RNG_MODE_PORTABLE")
        want = ref.fill_steps(SEED, "v", "float32", (8, 6), reference, box)
        assert got["v"] == np.ascontiguousarray(want).tobytes()


# ----------------------------------------------------------- bad input ----

def w(**extra):
    t = {"name": "w", "shape": [4, 4], "dtype": "float32"}
    t.update(extra)
    return t


BAD = [
    ("values of the wrong size",
     [w(init=values_json(np.zeros(15, dtype=np.float32)))],
     ["model.tensors[0] (\"w\").init", "values.data has 60 bytes",
      "needs 64"]),
    ("values step of the wrong size for its region",
     [w(initSteps=[{"init": {"zeros": {}}},
                   {"init": values_json(np.zeros(4, dtype=np.float32)),
                    "region": region_json((0, 0), (2, 4))}])],
     ["init_steps[1].init", "region [0:2, 0:4]", "needs 32"]),
    ("region out of bounds",
     [w(initSteps=[{"init": {"zeros": {}}},
                   {"init": {"ones": {}},
                    "region": region_json((3, 0), (2, 4))}])],
     ["init_steps[1]", "region[0] is offset 3 length 2"]),
    ("region of the wrong rank",
     [w(initSteps=[{"init": {"zeros": {}}},
                   {"init": {"ones": {}}, "region": region_json((0,), (2,))}])],
     ["init_steps[1]", "region has 1 ranges for a tensor of 2 dimensions"]),
    ("first step on a region",
     [w(initSteps=[{"init": {"zeros": {}},
                    "region": region_json((0, 0), (2, 4))}])],
     ["init_steps[0]", "must cover the whole tensor"]),
    ("steps and init together",
     [w(init={"zeros": {}}, initSteps=[{"init": {"ones": {}}}])],
     ["model.tensors[0] (\"w\")", "has both init and init_steps"]),
    ("module_default as a step",
     [w(moduleType="Linear", initSteps=[{"init": {"moduleDefault": {}}}])],
     ["init_steps[0]", "module_default cannot be a step"]),
    ("NaN in values",
     [w(init=values_json(np.array([0] * 15 + [np.nan], dtype=np.float32)))],
     ["model.tensors[0] (\"w\").init", "element 15 is NaN"]),
    ("more steps than a tensor may have",
     [w(initSteps=[{"init": {"zeros": {}}}] * 1025)],
     ["model.tensors[0] (\"w\").init_steps",
      "1025 steps; the limit is 1024 per tensor"]),
]


@pytest.mark.parametrize("title,tensors,parts", BAD, ids=[b[0] for b in BAD])
def test_bad_steps_are_refused_naming_the_tensor(server, title, tensors, parts):
    text = json.dumps({"model": {"tensors": tensors, "rng": "RNG_MODE_TORCH"}})
    for call, cls in ((server.stub.Plan, server.pb.PlanRequest),
                      (server.stub.Materialize, server.pb.MaterializeRequest)):
        with pytest.raises(grpc.RpcError) as e:
            call(server.parse_request(text, cls), metadata=server.md("bad"),
                 timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, title
        for part in parts:
            assert part in e.value.details(), (title, e.value.details())
    server.assert_idle(client="bad")


def test_values_over_the_request_limit(server):
    """128 MiB of values per request (docs/api.md): 64 MiB + 64 MiB pass
    validation's limit check, one byte more is refused naming the tensor
    that crosses it. The tensors are uint8 so the sizes are the bytes."""
    half = 64 << 20
    pb = server.pb
    req = pb.PlanRequest()
    a = req.model.tensors.add(name="a", shape=[half], dtype="uint8")
    a.init.values.data = bytes(half)
    b = req.model.tensors.add(name="b", shape=[half + 1], dtype="uint8")
    b.init.values.data = bytes(half + 1)
    with pytest.raises(grpc.RpcError) as e:
        server.stub.Plan(req, metadata=server.md("big"), timeout=120)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'model.tensors[1] ("b")' in e.value.details()
    assert "134217729 bytes; the limit is 134217728 bytes per request" in \
        e.value.details()
    server.assert_idle(client="big")
