"""Derived values through the server, at the wire level: elementwise
programs over a draw (InitStep.map) and norms of another tensor (norm_of).

Torch mode: bit for bit the Python of docs/init.md ("Derived values"): the
draw from the tensor's generator into a tensor of the compute dtype, the
same ATen ops in order, and a copy into the tensor. Portable mode: bit for
bit the NumPy reference of docs/portable-rng.md, section 14
(portable_ref.run_program), and every shard the slice of the full tensor.
Bad programs (inf or NaN possible), norms of tensors outside the request
and cycles are INVALID_ARGUMENT naming the tensor, with nothing held."""

import json
import math

import grpc
import numpy as np
import pytest
import torch

import matutil as m
import portable_ref as ref

SEED = 777
DT_MIN, DT_MAX, FLOOR = 0.001, 0.1, 1e-4

# The state-space models' dt bias (Mamba):
#   dt = exp(rand(n) * (ln max - ln min) + ln min).clamp(min=floor)
#   bias = dt + log(-expm1(-dt))
DT_OPS = [
    {"kind": "MUL", "x": 0, "c": math.log(DT_MAX) - math.log(DT_MIN)},
    {"kind": "ADD", "x": 1, "c": math.log(DT_MIN)},
    {"kind": "EXP", "x": 2},
    {"kind": "CLAMP", "x": 3, "min": FLOOR},
    {"kind": "NEG", "x": 4},
    {"kind": "EXPM1", "x": 5},
    {"kind": "NEG", "x": 6},
    {"kind": "LOG", "x": 7},
    {"kind": "ADD", "x": 4, "y": 8},
]


def dt_python(n, g, dtype):
    u = torch.rand(n, generator=g)
    dt = torch.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
    dt = torch.clamp(dt, min=FLOOR)
    inv = dt + torch.log(-torch.expm1(-dt))
    return torch.empty(n, dtype=dtype).copy_(inv)


def materialize(server, tensors, rng="RNG_MODE_TORCH", client="derived"):
    req = {"model": {"tensors": tensors, "seed": str(SEED), "rng": rng}}
    _, info, blob = m.materialize_describe_fetch(server, json.dumps(req), client)
    return m.load_safetensors(blob), info


def refused(server, tensors, rng="RNG_MODE_TORCH", client="derived-bad"):
    req = {"model": {"tensors": tensors, "seed": str(SEED), "rng": rng}}
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)), client)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    server.assert_idle(client=client)
    return e.value.details()


@pytest.mark.parametrize("dtype,n", [("float32", 96), ("bfloat16", 96),
                                     ("float32", 300_001)])
def test_torch_dt_bias_equals_the_model_code_with_the_tensor_generator(server, dtype, n):
    """300,001 elements: the server runs the program in chunks; the bits
    are still those of the whole tensor."""
    name = "backbone.layers.0.mixer.dt_proj.bias"
    got, info = materialize(server, [{
        "name": name, "shape": [n], "dtype": dtype,
        "initSteps": [{"init": {"uniform": {}},
                       "map": {"dtype": "float32", "ops": DT_OPS}}]}])
    want = dt_python(n, m.generator(SEED, name), m.TORCH_DTYPES[dtype])
    assert m.same_bits(got[name], want)
    softplus = torch.nn.functional.softplus(got[name].float())
    assert softplus.min() >= FLOOR * 0.99 and softplus.max() <= DT_MAX * 1.01
    assert "then map[float32: *" in info.tensors[0].init


def test_torch_log_of_uniform_and_every_unary_op(server):
    """A_log = log(uniform(1, 16)); and a program using each op kind once."""
    ops = [{"kind": "LOG", "x": 0}, {"kind": "SQRT", "x": 1},
           {"kind": "RECIPROCAL", "x": 2}, {"kind": "LOG1P", "x": 3},
           {"kind": "POW", "x": 4, "c": 1.5}, {"kind": "SOFTPLUS", "x": 5},
           {"kind": "SUB", "x": 6, "c": 2.0, "constantFirst": True},
           {"kind": "DIV", "x": 7, "c": 3.0, "constantFirst": True},
           {"kind": "MUL", "x": 8, "y": 1}, {"kind": "DIV", "x": 9, "y": 2},
           {"kind": "SUB", "x": 10, "y": 3}]
    got, _ = materialize(server, [
        {"name": "A_log", "shape": [4, 32], "dtype": "float32",
         "initSteps": [{"init": {"uniform": {"a": 1, "b": 16}},
                        "map": {"ops": [{"kind": "LOG", "x": 0}]}}]},
        {"name": "w", "shape": [64], "dtype": "float32",
         "initSteps": [{"init": {"uniform": {"a": 2, "b": 16}},
                        "map": {"ops": ops}}]}])
    a = torch.log(torch.empty(4, 32).uniform_(1, 16, generator=m.generator(SEED, "A_log")))
    assert m.same_bits(got["A_log"], a)
    u = torch.empty(64).uniform_(2, 16, generator=m.generator(SEED, "w"))
    v1 = torch.log(u)
    v2 = torch.sqrt(v1)
    v3 = torch.reciprocal(v2)
    v4 = torch.log1p(v3)
    v5 = v4 ** 1.5
    v6 = torch.nn.functional.softplus(v5)
    v7 = 2.0 - v6
    v8 = torch.full_like(v7, 3.0) / v7
    v9 = v8 * v1
    v10 = v9 / v2
    v11 = v10 - v3
    assert m.same_bits(got["w"], v11)


@pytest.mark.parametrize("dim", [0, 2, -1])
def test_torch_weight_norm_g_is_the_norm_of_v(server, dim):
    """weight_norm's original0 = norm_except_dim(original1, 2, dim), v drawn
    by its own init, in another task that runs first."""
    v_name = "conv.parametrizations.weight.original1"
    g_name = "conv.parametrizations.weight.original0"
    shape = [16, 4, 5]
    g_shape = [] if dim < 0 else [s if d == dim else 1 for d, s in enumerate(shape)]
    got, info = materialize(server, [
        {"name": g_name, "shape": g_shape, "dtype": "float32",
         "init": {"normOf": {"tensor": v_name, "dim": dim}}},
        {"name": v_name, "shape": shape, "dtype": "float32",
         "init": {"normal": {"std": 0.5}}}])
    v = torch.empty(shape).normal_(0, 0.5, generator=m.generator(SEED, v_name))
    assert m.same_bits(got[v_name], v)
    assert m.same_bits(got[g_name], torch.norm_except_dim(v, 2, dim))
    assert "norm_of" in {t.name: t.init for t in info.tensors}[g_name]


def test_torch_norm_of_a_module_default_and_a_tie(server):
    """The source may be a module default (Conv1d's kaiming), named through
    a tie; a chain g2 = norm(g1) runs after g1."""
    got, _ = materialize(server, [
        {"name": "conv.weight", "shape": [8, 3, 5], "dtype": "float32",
         "moduleType": "Conv1d"},
        {"name": "alias", "shape": [8, 3, 5], "dtype": "float32", "tieTo": "conv.weight"},
        {"name": "g1", "shape": [8, 1, 1], "dtype": "float32",
         "init": {"normOf": {"tensor": "alias", "dim": 0}}},
        {"name": "g2", "shape": [], "dtype": "float32",
         "init": {"normOf": {"tensor": "g1", "dim": -1}}}])
    conv = torch.nn.Conv1d(3, 8, 5, bias=False)
    m.reset_module(conv, SEED, "conv")
    assert m.same_bits(got["conv.weight"], conv.weight.detach())
    g1 = torch.norm_except_dim(conv.weight.detach(), 2, 0)
    assert m.same_bits(got["g1"], g1)
    assert m.same_bits(got["g2"], torch.norm_except_dim(g1, 2, -1))


# -------------------------------------------------------------- portable ----

def portable_leaf(name, shape, params):
    return ref.fill(SEED, name, "float32", "uniform", params, shape)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_portable_dt_bias_equals_the_reference(server, dtype):
    name = "mixer.dt_bias"
    n = 200
    got, _ = materialize(server, [{
        "name": name, "shape": [n], "dtype": dtype,
        "initSteps": [{"init": {"uniform": {}},
                       "map": {"dtype": "float32", "ops": DT_OPS}}]}],
        rng="RNG_MODE_PORTABLE")
    leaf = portable_leaf(name, [n], {"a": 0.0, "b": 1.0})
    want = ref.run_program(DT_OPS, leaf).astype(np.float32)
    want_t = torch.from_numpy(want).to(m.TORCH_DTYPES[dtype])
    assert m.same_bits(got[name], want_t)
    # dt itself is log-uniform in [DT_MIN, DT_MAX]: softplus undoes the bias.
    dt = torch.nn.functional.softplus(got[name].double())
    assert dt.min() >= DT_MIN * 0.99 and dt.max() <= DT_MAX * 1.01
    assert abs(torch.log(dt).mean().item() - (math.log(DT_MIN) + math.log(DT_MAX)) / 2) < 0.4


# One program per function, over leaves inside each function's domain (the
# large and small sides of expm1 both): the server's float32 and float64
# arithmetic against the reference's, bit for bit.
EVERY_OP = [
    ({"a": -80.0, "b": 80.0}, {"kind": "EXP", "x": 0}),
    ({"a": -0.3, "b": 0.3}, {"kind": "EXPM1", "x": 0}),
    ({"a": -5.0, "b": 5.0}, {"kind": "EXPM1", "x": 0}),
    ({"a": 1e-3, "b": 1e4}, {"kind": "LOG", "x": 0}),
    ({"a": -0.9, "b": 4.0}, {"kind": "LOG1P", "x": 0}),
    ({"a": -30.0, "b": 30.0}, {"kind": "SOFTPLUS", "x": 0}),
    ({"a": 0.1, "b": 9.0}, {"kind": "POW", "x": 0, "c": 1.37}),
    ({"a": -3.0, "b": 3.0}, {"kind": "POW", "x": 0, "c": 5.0}),
    ({"a": 0.0, "b": 9.0}, {"kind": "SQRT", "x": 0}),
    ({"a": 0.5, "b": 9.0}, {"kind": "RECIPROCAL", "x": 0}),
    ({"a": 0.5, "b": 9.0}, {"kind": "DIV", "x": 0, "c": 0.1, "constantFirst": True}),
    ({"a": -2.0, "b": 2.0}, {"kind": "CLAMP", "x": 0, "min": -0.5, "max": 1.1}),
]


@pytest.mark.parametrize("compute", ["float32", "float64"])
def test_portable_every_function_equals_the_reference(server, compute):
    n = 300
    tensors = []
    for k, (params, op) in enumerate(EVERY_OP):
        tensors.append({"name": f"t{k}", "shape": [n], "dtype": compute,
                        "initSteps": [{"init": {"uniform": params},
                                       "map": {"dtype": compute, "ops": [op]}}]})
    got, _ = materialize(server, tensors, rng="RNG_MODE_PORTABLE")
    for k, (params, op) in enumerate(EVERY_OP):
        leaf = ref.fill(SEED, f"t{k}", compute, "uniform", params, [n])
        want = ref.run_program([op], leaf, compute=compute)
        assert m.same_bits(got[f"t{k}"], torch.from_numpy(want)), (compute, op)


def test_portable_shards_of_a_program_and_a_norm_are_slices_of_the_whole(server):
    """dt bias split in 3 and weight norm's g split in 2 along dim 0 (v
    whole, and v itself split along dim 1 so no rank holds the rows its g
    needs): each shard's bytes are the full tensor's slice."""
    v_shape = [6, 4, 3]

    def tensors(shard_dt=None, shard_g=None, shard_v=None):
        dt = {"name": "dt", "shape": [10], "dtype": "float32",
              "initSteps": [{"init": {"uniform": {}},
                             "map": {"dtype": "float32", "ops": DT_OPS}}]}
        g = {"name": "g", "shape": [6, 1, 1], "dtype": "bfloat16",
             "init": {"normOf": {"tensor": "v", "dim": 0}}}
        v = {"name": "v", "shape": v_shape, "dtype": "bfloat16",
             "initSteps": [{"init": {"normal": {"std": 0.3}}},
                           {"init": {"zeros": {}},
                            "region": [{"offset": 1, "length": 1},
                                       {"offset": 0, "length": 4},
                                       {"offset": 0, "length": 3}]}]}
        for t, s in ((dt, shard_dt), (g, shard_g), (v, shard_v)):
            if s is not None:
                t["shard"] = {"split": {"dim": s[0], "index": s[1], "count": s[2]}}
        return tensors_list(dt, g, v)

    def tensors_list(*ts):
        return list(ts)

    whole, _ = materialize(server, tensors(), rng="RNG_MODE_PORTABLE")
    v_full = whole["v"].float()
    assert torch.equal(whole["g"].float(),
                       torch.norm_except_dim(v_full.double(), 2, 0).float().bfloat16().float())
    for k in range(3):
        part, _ = materialize(server, tensors(shard_dt=(0, k, 3), shard_g=(0, k % 2, 2),
                                              shard_v=(1, k % 2, 2)),
                              rng="RNG_MODE_PORTABLE")
        dt_slice = torch.chunk(whole["dt"], 3)[k]
        assert m.same_bits(part["dt"], dt_slice)
        assert m.same_bits(part["g"], torch.chunk(whole["g"], 2, dim=0)[k % 2])
        assert m.same_bits(part["v"], torch.chunk(whole["v"], 2, dim=1)[k % 2])


def test_portable_norm_follows_the_documented_sum(server):
    got, _ = materialize(server, [
        {"name": "v", "shape": [5, 7], "dtype": "float32", "init": {"normal": {}}},
        {"name": "g", "shape": [1, 7], "dtype": "float32",
         "init": {"normOf": {"tensor": "v", "dim": 1}}}], rng="RNG_MODE_PORTABLE")
    v = got["v"].double().numpy()
    want = np.zeros(7)
    for i in range(5):          # row-major order: i outer, j inner
        for j in range(7):
            want[j] = want[j] + v[i, j] * v[i, j]
    want = np.sqrt(want).astype(np.float32).reshape(1, 7)
    assert m.same_bits(got["g"], torch.from_numpy(want))


# -------------------------------------------------------------- bad input ----

def test_a_program_that_could_overflow_or_leave_its_domain_is_refused(server):
    cases = [
        ({"normal": {"std": 100}}, [{"kind": "EXP", "x": 0}], "map.ops[0] (exp)"),
        ({"uniform": {}}, [{"kind": "LOG", "x": 0}], "takes log of values in [0"),
        ({"uniform": {"a": -1, "b": 1}}, [{"kind": "RECIPROCAL", "x": 0}], "holds 0"),
        ({"uniform": {"a": -1, "b": 1}}, [{"kind": "SQRT", "x": 0}], "below 0"),
        ({"uniform": {"a": -1, "b": 1}}, [{"kind": "POW", "x": 0, "c": 0.5}], "non-integer"),
        ({"uniform": {"a": 0, "b": 20}}, [{"kind": "EXP", "x": 0}],
         "beyond float16's largest finite value"),
        ({"uniform": {}}, [{"kind": "EXP", "x": 3}], "map.ops[0].x is 3"),
        ({"uniform": {}}, [{"kind": "ADD", "x": 0}], "needs a second operand"),
        ({"uniform": {}}, [{"kind": "CLAMP", "x": 0}], "needs min, max"),
        ({"empty": {}}, [{"kind": "EXP", "x": 0}], "map starts from empty"),
    ]
    for k, (leaf, ops, text) in enumerate(cases):
        msg = refused(server, [{"name": f"t{k}", "shape": [8], "dtype": "float16",
                                "initSteps": [{"init": leaf, "map": {"dtype": "float32",
                                                                      "ops": ops}}]}])
        assert f'"t{k}"' in msg and text in msg, (k, msg)


def test_a_norm_of_a_missing_tensor_or_a_cycle_is_refused(server):
    msg = refused(server, [{"name": "g", "shape": [4, 1], "dtype": "float32",
                            "init": {"normOf": {"tensor": "elsewhere.v", "dim": 0}}}])
    assert '"g"' in msg and '"elsewhere.v"' in msg and "not a tensor of this request" in msg
    msg = refused(server, [
        {"name": "a", "shape": [], "dtype": "float32", "init": {"normOf": {"tensor": "b", "dim": -1}}},
        {"name": "b", "shape": [], "dtype": "float32", "init": {"normOf": {"tensor": "a", "dim": -1}}}],
        rng="RNG_MODE_PORTABLE")
    assert '"a" reads "b" reads "a"' in msg
    msg = refused(server, [
        {"name": "v", "shape": [4, 3], "dtype": "float32", "init": {"normal": {}}},
        {"name": "g", "shape": [3, 1], "dtype": "float32",
         "init": {"normOf": {"tensor": "v", "dim": 0}}}])
    assert '"g" has shape [3, 1]' in msg and "has shape [4, 1]" in msg
    msg = refused(server, [
        {"name": "v", "shape": [4, 3], "dtype": "float32", "init": {"constant": {"val": 1e30}}},
        {"name": "g", "shape": [4, 1], "dtype": "float32",
         "init": {"normOf": {"tensor": "v", "dim": 0}}}])
    assert '"g"' in msg and "sum of squares" in msg
