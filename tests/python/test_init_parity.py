"""Every init scheme, module default and computed buffer through the running
server, compared bit for bit with the Python reference of docs/init.md
(tests/python/matutil.py: reference, reset_module, rope_inv_freq).

One Materialize per scheme (every dtype x shape in one request) keeps the
suite fast; each test releases what it materializes and checks the server
holds nothing afterwards."""

import contextlib
import copy
import json
import random
import warnings

import grpc
import pytest
import torch
from torch import nn

import matutil as m

SEED = 20261130
FLOATS = ["float32", "float64", "float16", "bfloat16", "float8_e4m3fn"]

# Shapes: 1-D, 2-D, odd, conv 3-D/4-D/5-D, zero-size, and one big enough
# (77,100 elements) that torch splits element-wise kernels across threads.
ONE_D = [[37]]
TWO_D = [[64, 48], [7, 13], [0, 5], [300, 257]]
CONV = [[8, 4, 5], [6, 4, 3, 3], [4, 2, 3, 3, 3]]
ANY = ONE_D + TWO_D + CONV + [[3, 0, 2]]
FAN = TWO_D + CONV  # >= 2 dimensions

SCHEMES = [
    # (id, oneof case, params, shapes)
    ("uniform", "uniform", {"a": -0.5, "b": 0.25}, ANY),
    ("normal", "normal", {"mean": 1.0, "std": 0.02}, ANY),
    ("trunc_normal", "trunc_normal", {}, ANY),
    ("trunc_normal_shifted", "trunc_normal",
     {"mean": 0.1, "std": 0.7, "a": -1.0, "b": 2.5}, ANY),
    ("xavier_uniform", "xavier_uniform", {}, FAN),
    ("xavier_uniform_relu", "xavier_uniform", {"gain": {"nonlinearity": "relu"}}, FAN),
    ("xavier_normal", "xavier_normal", {"gain": {"value": 0.5}}, FAN),
    ("kaiming_uniform", "kaiming_uniform", {}, FAN),
    ("kaiming_uniform_leaky", "kaiming_uniform",
     {"a": 0.2, "mode": "fan_out", "nonlinearity": "leaky_relu"}, FAN),
    ("kaiming_normal", "kaiming_normal", {"mode": "fan_out", "nonlinearity": "relu"}, FAN),
    ("kaiming_normal_tanh", "kaiming_normal", {"nonlinearity": "tanh"}, FAN),
    ("orthogonal", "orthogonal", {}, FAN),
    ("orthogonal_gain", "orthogonal", {"gain": {"nonlinearity": "leaky_relu", "param": 0.3}}, FAN),
    ("eye", "eye", {}, TWO_D),
    ("dirac", "dirac", {}, CONV + [[0, 4, 3]]),
    ("dirac_groups", "dirac", {"groups": 2}, CONV),
    ("sparse", "sparse", {"sparsity": 0.3, "std": 0.5}, TWO_D),
    ("sparse_all", "sparse", {"sparsity": 1.0}, [[5, 4]]),
    ("zeros", "zeros", {}, ANY),
    ("ones", "ones", {}, ANY),
    ("constant", "constant", {"val": -1.5}, ANY),
    ("empty", "empty", {}, ANY),
    ("arange", "arange", {"start": 0.5, "step": 0.005}, ANY),  # < 448 (float8)
]


def tensor(name, shape, dtype, init=None, **kw):
    t = {"name": name, "shape": list(shape), "dtype": dtype, **kw}
    if init is not None:
        t["init"] = init
    return t


def request(tensors, rules=(), modules=(), seed=SEED):
    # Parity with torch.nn.init is torch mode (the server's default is
    # portable).
    return {"model": {"tensors": list(tensors), "initRules": list(rules),
                      "modules": list(modules), "seed": str(seed),
                      "rng": "RNG_MODE_TORCH"}}


@contextlib.contextmanager
def materialized(server, req, client=None):
    """Materializes a request dict; yields {name: tensor} of every tensor."""
    resp = server.materialize(server.parse_request(json.dumps(req)), client)
    try:
        blob = server.fetch(resp.handle, client, include_non_persistent=True)
        yield m.load_safetensors(blob)
    finally:
        server.release(resp.handle, client)


def assert_same(got, want, what):
    assert got.dtype == want.dtype and list(got.shape) == list(want.shape), (
        what, got.dtype, want.dtype, got.shape, want.shape)
    if not m.same_bits(got, want):
        diff = (got.double() - want.double()).abs()
        pytest.fail(f"{what}: not bit for bit; {int((diff > 0).sum())} of "
                    f"{got.numel()} differ, max |diff| {diff.max().item():.3g}")


@pytest.mark.parametrize("case", SCHEMES, ids=[c[0] for c in SCHEMES])
def test_scheme_matches_torch_bit_for_bit(server, case):
    label, scheme, params, shapes = case
    specs = []
    for dtype in FLOATS:
        for k, shape in enumerate(shapes):
            specs.append(tensor(f"{label}.{dtype}.{k}", shape, dtype,
                                {scheme: params}))
    with materialized(server, request(specs)) as got:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "zero-element tensors"
            for t in specs:
                want = m.reference(t["shape"], m.TORCH_DTYPES[t["dtype"]],
                                   scheme, params, SEED, t["name"])
                assert_same(got[t["name"]], want, t["name"])
    server.assert_idle()


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "bool"]


def test_integer_and_bool_tensors(server):
    specs = []
    for dtype in INT_DTYPES:
        specs += [
            tensor(f"eye.{dtype}", [5, 7], dtype, {"eye": {}}),
            tensor(f"dirac.{dtype}", [4, 4, 3, 3], dtype, {"dirac": {"groups": 2}}),
            tensor(f"zeros.{dtype}", [3, 3], dtype, {"zeros": {}}),
            tensor(f"ones.{dtype}", [3, 3], dtype, {"ones": {}}),
            tensor(f"empty.{dtype}", [9], dtype, {"empty": {}}),
        ]
        if dtype != "bool":
            specs.append(tensor(f"arange.{dtype}", [2, 30], dtype,
                                {"arange": {"start": 3, "step": 2}}))
    specs.append(tensor("arange.neg", [6], "int8", {"arange": {"start": 5, "step": -3}}))
    with materialized(server, request(specs)) as got:
        for t in specs:
            (scheme, params), = t["init"].items()
            want = m.reference(t["shape"], m.TORCH_DTYPES[t["dtype"]], scheme,
                               params, SEED, t["name"])
            assert_same(got[t["name"]], want, t["name"])
    assert got["arange.int64"].flatten()[:3].tolist() == [3, 5, 7]
    server.assert_idle()


ROPE_CASES = [
    ("default", {}, 64),
    ("base_dim", {"base": 500000.0, "dim": 128}, 64),
    ("partial", {"dim": 24}, 12),
    ("odd_dim", {"dim": 7}, 4),
    ("linear", {"scaling": {"type": "linear", "factor": 4.0}}, 64),
    ("dynamic", {"scaling": {"type": "dynamic", "factor": 2.0}}, 64),
    ("llama3", {"base": 500000.0, "scaling": {
        "type": "llama3", "factor": 8.0, "lowFreqFactor": 1.0,
        "highFreqFactor": 4.0, "originalMaxPositionEmbeddings": 8192}}, 64),
    ("llama3_defaults", {"scaling": {"type": "llama3", "factor": 32.0,
                                     "originalMaxPositionEmbeddings": 2048}}, 32),
    ("yarn", {"scaling": {"type": "yarn", "factor": 4.0,
                          "originalMaxPositionEmbeddings": 4096}}, 64),
    ("yarn_betas", {"base": 50000.0, "scaling": {
        "type": "yarn", "factor": 16.0, "originalMaxPositionEmbeddings": 2048,
        "betaFast": 8.0, "betaSlow": 2.0}}, 48),
    ("yarn_narrow", {"scaling": {"type": "yarn", "factor": 2.0,
                                 "originalMaxPositionEmbeddings": 64,
                                 "betaFast": 1.0, "betaSlow": 1.0}}, 8),
]


def test_rope_inv_freq_matches_the_hugging_face_formulas(server):
    specs = []
    for label, params, length in ROPE_CASES:
        for dtype in ["float32", "bfloat16", "float16", "float64"]:
            specs.append(tensor(f"rope.{label}.{dtype}", [length], dtype,
                                {"ropeInvFreq": params}, kind="TENSOR_KIND_BUFFER",
                                persistent=False))
    with materialized(server, request(specs)) as got:
        for t in specs:
            want = m.reference(t["shape"], m.TORCH_DTYPES[t["dtype"]],
                               "rope_inv_freq", t["init"]["ropeInvFreq"], SEED,
                               t["name"])
            assert_same(got[t["name"]], want, t["name"])
        # The scalings do what they say.
        base = got["rope.default.float32"]
        assert base[0] == 1.0
        assert torch.equal(got["rope.linear.float32"], base / 4.0)
        assert torch.equal(got["rope.dynamic.float32"], base)
    server.assert_idle()


# -- module_default --------------------------------------------------------

def module_zoo():
    """name -> a torch.nn module, built with the arguments its spec says."""
    return {
        "lin": nn.Linear(20, 30),
        "lin_nobias": nn.Linear(7, 3, bias=False),
        "bil": nn.Bilinear(4, 5, 6),
        "c1": nn.Conv1d(4, 6, 3),
        "c2": nn.Conv2d(4, 6, (3, 2), groups=2),
        "c3": nn.Conv3d(2, 4, 3, bias=False),
        "ct1": nn.ConvTranspose1d(4, 6, 3),
        "ct2": nn.ConvTranspose2d(4, 6, 3, groups=2),
        "ct3": nn.ConvTranspose3d(2, 4, 2),
        "emb": nn.Embedding(10, 4, padding_idx=3),
        "emb_neg": nn.Embedding(10, 4, padding_idx=-2),
        "emb_plain": nn.Embedding(6, 3),
        "bag": nn.EmbeddingBag(12, 5, padding_idx=0),
        "ln": nn.LayerNorm(8),
        "ln_nobias": nn.LayerNorm([2, 4], bias=False),
        "rms": nn.RMSNorm(8),
        "gn": nn.GroupNorm(2, 8),
        "bn1": nn.BatchNorm1d(5),
        "bn2": nn.BatchNorm2d(5),
        "bn3": nn.BatchNorm3d(5, affine=False),
        "in1": nn.InstanceNorm1d(5, affine=True, track_running_stats=True),
        "in2": nn.InstanceNorm2d(5, affine=True),
        "in3": nn.InstanceNorm3d(5, track_running_stats=True),
        "mha": nn.MultiheadAttention(8, 2),
        "mha_kv": nn.MultiheadAttention(8, 2, add_bias_kv=True, kdim=5, vdim=6),
        "mha_nobias": nn.MultiheadAttention(8, 2, bias=False, add_bias_kv=True),
        "rnn": nn.RNN(5, 7, num_layers=2, nonlinearity="relu"),
        "gru": nn.GRU(5, 6, bidirectional=True),
        "lstm": nn.LSTM(5, 8, num_layers=2, proj_size=3, bidirectional=True),
        "lstm_nobias": nn.LSTM(4, 6, bias=False),
        "rnncell": nn.RNNCell(3, 4),
        "grucell": nn.GRUCell(3, 4, bias=False),
        "lstmcell": nn.LSTMCell(3, 4),
    }


def module_specs(zoo, dtype_name, type_style=0):
    """Tensor specs (module_type from the owning submodule's class) and
    ModuleSpecs (padding_idx) for a zoo, every tensor module_default."""
    dtype = m.TORCH_DTYPES[dtype_name]
    tensors, modules = [], []
    for name, module in zoo.items():
        module.to(dtype)
        buffers = {n for n, _ in module.named_buffers()}
        for local, value in module.state_dict().items():
            owner = local.rpartition(".")[0]
            cls = type(module.get_submodule(owner)).__name__
            cls = [cls, f"torch.nn.{cls}", f"nn.{cls}"][type_style % 3]
            type_style += 1
            tensors.append(tensor(
                f"{name}.{local}", value.shape, str(value.dtype).removeprefix("torch."),
                kind="TENSOR_KIND_BUFFER" if local in buffers else "TENSOR_KIND_PARAMETER",
                moduleType=cls))
        if getattr(module, "padding_idx", None) is not None:
            # torch stores it normalized; "*_neg" modules send it negative.
            idx = module.padding_idx
            if name.endswith("_neg"):
                idx -= module.num_embeddings
            modules.append({"name": name, "type": type(module).__name__,
                            "paddingIdx": str(idx)})
    return tensors, modules


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_module_default_matches_reset_parameters(server, dtype):
    zoo = module_zoo()
    tensors, modules = module_specs(zoo, dtype)
    rules = [{"pattern": "*", "init": {"moduleDefault": {}}}]
    with materialized(server, request(tensors, rules, modules)) as got:
        for name, module in zoo.items():
            m.reset_module(module, SEED, name)
            for local, want in module.state_dict().items():
                assert_same(got[f"{name}.{local}"], want, f"{name}.{local} ({dtype})")
    # Sanity: the references did what the modules do.
    assert torch.count_nonzero(zoo["emb"].weight[3]) == 0
    assert torch.count_nonzero(zoo["mha"].out_proj.bias) == 0
    server.assert_idle()


def test_module_default_float8_goes_through_float32(server):
    zoo = {"lin": nn.Linear(6, 5), "emb": nn.Embedding(7, 3, padding_idx=1)}
    tensors, modules = module_specs(zoo, "float32")
    for t in tensors:
        t["dtype"] = "float8_e4m3fn"
    with materialized(server, request(tensors, [{"pattern": "*", "init": {"moduleDefault": {}}}],
                                      modules)) as got:
        for name, module in zoo.items():
            m.reset_module(module, SEED, name)
            for local, want in module.state_dict().items():
                assert_same(got[f"{name}.{local}"], want.to(torch.float8_e4m3fn), local)
    server.assert_idle()


def test_module_default_with_overrides_and_absent_tensors(server):
    """Tensors with other inits, and absent tensors whose shape follows from
    the rest, still consume their draws: the module_default ones match."""
    zoo = {
        "fc": nn.Linear(20, 30),
        "lstm": nn.LSTM(5, 8, num_layers=2, proj_size=3, bidirectional=True),
        "attn": nn.MultiheadAttention(8, 2, add_bias_kv=True),
    }
    tensors, modules = module_specs(zoo, "float32")
    overrides = {"fc.weight": {"zeros": {}},
                 "lstm.weight_hh_l0": {"normal": {"std": 3.0}},
                 "attn.bias_k": {"ones": {}}}
    absent = {"lstm.bias_ih_l0", "lstm.weight_hr_l0_reverse", "attn.in_proj_weight"}
    tensors = [t for t in tensors if t["name"] not in absent]
    for t in tensors:
        if t["name"] in overrides:
            t["init"] = overrides[t["name"]]
    rules = [{"pattern": "*", "init": {"moduleDefault": {}}}]
    with materialized(server, request(tensors, rules, modules)) as got:
        assert set(got) == {t["name"] for t in tensors}
        for name, module in zoo.items():
            m.reset_module(module, SEED, name)
            for local, want in module.state_dict().items():
                full = f"{name}.{local}"
                if full in absent:
                    continue
                if full in overrides:
                    (scheme, params), = overrides[full].items()
                    want = m.reference(want.shape, want.dtype, scheme, params, SEED, full)
                assert_same(got[full], want, full)
    server.assert_idle()


def test_module_default_errors_name_the_tensor(server):
    cases = [
        # bias needs the weight's shape (fan_in) and draws.
        ([tensor("fc.bias", [3], "float32", moduleType="Linear")], [], "fc.bias",
         "fc.weight"),
        ([tensor("fc.weight", [3, 2], "float32")], [], "fc.weight",
         "needs the type of module"),
        ([tensor("x.weight", [3, 2], "float32", moduleType="Transformer")], [], "x.weight",
         "Linear, NonDynamicallyQuantizableLinear"),
        ([tensor("e.weight", [5, 2], "float32")],
         [{"name": "e", "type": "Embedding", "paddingIdx": "7"}], "e.weight",
         "padding_idx is 7"),
        ([tensor("rnn.weight_hh_l0", [8, 2], "float32", moduleType="LSTM")], [],
         "rnn.weight_hh_l0", "rnn.weight_ih_l0"),
    ]
    for tensors, modules, name, reason in cases:
        req = request(tensors, [{"pattern": "*", "init": {"moduleDefault": {}}}], modules)
        with pytest.raises(grpc.RpcError) as e:
            server.materialize(server.parse_request(json.dumps(req)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert name in e.value.details() and reason in e.value.details(), e.value.details()
    server.assert_idle()


# -- order, coverage, bad input, empty --------------------------------------

def mixed_request():
    tensors = []
    for k, (label, scheme, params, shapes) in enumerate(SCHEMES):
        shape = next(s for s in shapes if 0 not in s)
        tensors.append(tensor(f"mix.{label}", shape, FLOATS[k % 4], {scheme: params}))
    tensors.append(tensor("rope.inv_freq", [32], "float32",
                          {"ropeInvFreq": {"scaling": {"type": "llama3", "factor": 8.0,
                                                       "originalMaxPositionEmbeddings": 256}}}))
    zoo = {"lin": nn.Linear(9, 4), "gru": nn.GRU(3, 4, num_layers=2)}
    mod_tensors, _ = module_specs(zoo, "float32")
    rules = [{"pattern": "lin.*", "init": {"moduleDefault": {}}},
             {"pattern": "gru.*", "init": {"moduleDefault": {}}}]
    return request(tensors + mod_tensors, rules)


def test_values_do_not_depend_on_order_or_on_other_tensors(server):
    req = mixed_request()
    with materialized(server, req) as base:
        base = {n: t.clone() for n, t in base.items()}
    shuffled = copy.deepcopy(req)
    random.Random(3).shuffle(shuffled["model"]["tensors"])
    with materialized(server, shuffled) as got:
        assert set(got) == set(base)
        for n, t in got.items():
            assert_same(t, base[n], f"shuffled: {n}")
    # A subset: every third tensor (module tensors included: the GRU's
    # missing ones have shapes its other tensors imply).
    subset = copy.deepcopy(req)
    keep = {"lin.weight", "gru.weight_ih_l0", "gru.bias_hh_l1"}
    subset["model"]["tensors"] = (
        [t for t in subset["model"]["tensors"] if t["name"].startswith("mix.")][::3]
        + [t for t in subset["model"]["tensors"] if t["name"] in keep])
    with materialized(server, subset) as got:
        assert len(got) == len(subset["model"]["tensors"]) < len(base)
        for n, t in got.items():
            assert_same(t, base[n], f"subset: {n}")
    server.assert_idle()


def test_uncovered_tensors_are_all_listed(server):
    names = [f"layer.{i}.weight" for i in range(5)]
    req = request([tensor(n, [2, 2], "float32") for n in names]
                  + [tensor("layer.0.bias", [2], "float32")],
                  rules=[{"pattern": "*.bias", "init": {"zeros": {}}}])
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = e.value.details()
    assert "5 tensors have no init" in details, details
    for n in names:
        assert f'"{n}"' in details, details
    assert "layer.0.bias" not in details
    server.assert_idle()


BAD = [
    # (id, shape, dtype, init, reason)
    ("xavier_1d", [5], "float32", {"xavierUniform": {}}, "at least 2 dimensions"),
    ("kaiming_0d", [], "float32", {"kaimingNormal": {}}, "at least 2 dimensions"),
    ("orthogonal_1d", [5], "float32", {"orthogonal": {}}, "orthogonal needs a tensor with at least 2"),
    ("dirac_2d", [3, 3], "float32", {"dirac": {}}, "dirac needs a 3-, 4- or 5-D"),
    ("dirac_6d", [1, 1, 1, 1, 1, 1], "float32", {"dirac": {}}, "dirac needs a 3-, 4- or 5-D"),
    ("dirac_groups", [3, 2, 3], "float32", {"dirac": {"groups": 2}}, "divisible by groups"),
    ("dirac_groups0", [4, 2, 3], "float32", {"dirac": {"groups": 0}}, "groups is 0"),
    ("eye_3d", [2, 2, 2], "float32", {"eye": {}}, "eye needs a 2-D"),
    ("sparse_1d", [4], "float32", {"sparse": {"sparsity": 0.5}}, "sparse needs a 2-D"),
    ("sparse_sparsity", [4, 4], "float32", {"sparse": {"sparsity": 1.5}}, "in [0, 1]"),
    ("sparse_std", [4, 4], "float32", {"sparse": {"sparsity": 0.5, "std": -1}}, "sparse.std is -1"),
    ("trunc_a_ge_b", [4], "float32", {"truncNormal": {"a": 1, "b": 1}}, "a must be < b"),
    ("trunc_std0", [4], "float32", {"truncNormal": {"std": 0}}, "trunc_normal.std is 0"),
    ("trunc_nan", [4], "float32", {"truncNormal": {"mean": "NaN"}}, "trunc_normal.mean is nan"),
    ("normal_neg_std", [4], "float32", {"normal": {"std": -0.1}}, "normal.std is -0.1"),
    ("gain_inf", [4, 4], "float32", {"xavierNormal": {"gain": {"value": "Infinity"}}}, "is inf"),
    ("nonlinearity", [4, 4], "float32", {"kaimingUniform": {"nonlinearity": "gelu"}},
     "use one of linear, conv1d"),
    ("mode", [4, 4], "float32", {"kaimingNormal": {"mode": "fan_avg"}}, "use one of fan_in, fan_out"),
    ("random_on_int", [4, 4], "int32", {"xavierUniform": {}}, "needs a floating-point dtype"),
    ("trunc_on_bool", [4], "bool", {"truncNormal": {}}, "needs a floating-point dtype"),
    ("arange_bool", [4], "bool", {"arange": {}}, "arange cannot fill a bool"),
    ("arange_range", [300], "int8", {"arange": {}}, "int8's range"),
    ("rope_shape", [4, 4], "float32", {"ropeInvFreq": {}}, "needs a 1-D tensor"),
    ("rope_dim", [10], "float32", {"ropeInvFreq": {"dim": 64}}, "gives 32 frequencies"),
    ("rope_type", [8], "float32", {"ropeInvFreq": {"scaling": {"type": "ntk"}}}, "llama3, yarn"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_invalid_argument_naming_the_tensor(server, case):
    label, shape, dtype, init, reason = case
    name = f"bad.{label}.weight"
    req = request([tensor("ok.weight", [3], "float32", {"ones": {}}),
                   tensor(name, shape, dtype, init)])
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)), client="bad-init")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert f'model.tensors[1] ("{name}")' in e.value.details(), e.value.details()
    assert reason in e.value.details(), e.value.details()
    # The same through a rule names the rule too.
    rule_req = request([tensor(name, shape, dtype)], rules=[{"pattern": "bad.*", "init": init}])
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(rule_req)), client="bad-init")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert 'model.init_rules[0] ("bad.*")' in e.value.details(), e.value.details()
    server.assert_idle(client="bad-init")


def test_empty_never_shows_another_clients_bytes(server):
    n = 3 << 20  # 3 MiB
    pattern = request([tensor("secret", [n], "uint8", {"constant": {"val": 165}})])
    with materialized(server, pattern, client="alice") as got:
        assert bool((got["secret"] == 165).all())
    blank = request([tensor("scratch", [n], "uint8", {"empty": {}}),
                     tensor("scratch_f", [n // 4], "float32", {"empty": {}})])
    with materialized(server, blank, client="bob") as got:
        assert torch.count_nonzero(got["scratch"]) == 0
        assert torch.count_nonzero(got["scratch_f"]) == 0
    server.assert_idle(client="alice")
    server.assert_idle(client="bob")


def test_llama_shaped_model_comes_back_fully_initialized(server):
    """Embedding, Linear and RMSNorm module defaults, a non-persistent
    llama3 inv_freq buffer and tied embeddings: every tensor initialized,
    as in Python, and the tie intact."""
    hidden, inter, heads, vocab, layers = 64, 160, 4, 100, 2
    head_dim = hidden // heads
    tensors = [tensor("model.embed_tokens.weight", [vocab, hidden], "bfloat16",
                      moduleType="Embedding")]
    for i in range(layers):
        p = f"model.layers.{i}"
        for proj, shape in [("self_attn.q_proj", [hidden, hidden]),
                            ("self_attn.k_proj", [hidden // 2, hidden]),
                            ("self_attn.v_proj", [hidden // 2, hidden]),
                            ("self_attn.o_proj", [hidden, hidden]),
                            ("mlp.gate_proj", [inter, hidden]),
                            ("mlp.up_proj", [inter, hidden]),
                            ("mlp.down_proj", [hidden, inter])]:
            tensors.append(tensor(f"{p}.{proj}.weight", shape, "bfloat16", moduleType="Linear"))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors.append(tensor(f"{p}.{norm}.weight", [hidden], "bfloat16",
                                  moduleType="torch.nn.RMSNorm"))
    tensors.append(tensor("model.norm.weight", [hidden], "bfloat16", moduleType="RMSNorm"))
    tensors.append(tensor("lm_head.weight", [vocab, hidden], "bfloat16",
                          moduleType="Linear", tieTo="model.embed_tokens.weight"))
    rope = {"base": 500000.0, "scaling": {"type": "llama3", "factor": 8.0,
                                          "originalMaxPositionEmbeddings": 64}}
    tensors.append(tensor("model.rotary_emb.inv_freq", [head_dim // 2], "float32",
                          kind="TENSOR_KIND_BUFFER", persistent=False))
    rules = [{"pattern": "*.inv_freq", "init": {"ropeInvFreq": rope}},
             {"pattern": "*", "init": {"moduleDefault": {}}}]
    with materialized(server, request(tensors, rules)) as got:
        assert set(got) == {t["name"] for t in tensors}
        for t in tensors:
            name = t["name"]
            module, _, local = name.rpartition(".")
            dtype = m.TORCH_DTYPES[t["dtype"]]
            if name.endswith("inv_freq"):
                want = m.rope_inv_freq(500000.0, head_dim, rope["scaling"])
            elif "tieTo" in t:
                want = got[t["tieTo"]]
            else:
                cls = t["moduleType"].rpartition(".")[2]
                shape = t["shape"]
                mod = {"Embedding": lambda: nn.Embedding(*shape),
                       "Linear": lambda: nn.Linear(shape[1], shape[0], bias=False),
                       "RMSNorm": lambda: nn.RMSNorm(shape[0])}[cls]().to(dtype)
                m.reset_module(mod, SEED, module)
                want = mod.state_dict()[local]
            assert_same(got[name], want, name)
        assert torch.count_nonzero(got["model.rotary_emb.inv_freq"]) == head_dim // 2
    server.assert_idle()


def test_describe_says_which_init_each_tensor_got(server):
    req = request([tensor("fc.weight", [4, 3], "float32", moduleType="Linear"),
                   tensor("fc.bias", [4], "float32", moduleType="Linear"),
                   tensor("w", [4, 4], "float32", {"orthogonal": {}})],
                  rules=[{"pattern": "fc.*", "init": {"moduleDefault": {}}}])
    resp = server.materialize(server.parse_request(json.dumps(req)))
    try:
        info = {t.name: t.init for t in server.describe(resp.handle).tensors}
    finally:
        server.release(resp.handle)
    assert info["fc.weight"].startswith('module_default(Linear "fc": kaiming_uniform(a=2.2360')
    assert info["fc.weight"].endswith('[rule 0 "fc.*"]')
    assert info["fc.bias"].startswith('module_default(Linear "fc": uniform(a=-0.57735')
    assert info["w"] == "orthogonal(gain=1) [tensor init]"
    server.assert_idle()
