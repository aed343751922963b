"""No tensor of a described model ends with garbage, and inits derived
from random draws are programs the server runs.

Describe-level tests (no server) check the exact steps and programs the
recorder makes: legacy constructors under meta_device(), real tensors,
elementwise programs over a draw (`map`), weight normalization's
`norm_of`, known values through any view, init code that reshapes model
tensors. The server-level tests materialize such models and compare with
the model's own Python code: bit for bit in torch mode (the draw made by
the per-tensor generator), by distribution and by formula in portable
mode."""

import math
import threading

import pytest
import torch
import torch.nn as nn

import materializer as mz
import matutil
from materializer import hf, reference
from materializer.capture import Spec

F = nn.functional
DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4


def steps(spec, name):
    return [(s.scheme.kind, s.scheme.params, s.region) for s in spec[name].steps]


def program(spec, name):
    """(leaf kind, leaf params, compute dtype, ops) of a one-step map."""
    (step,) = spec[name].steps
    assert step.region is None and step.scheme.kind == "map", step
    p = step.scheme.params
    return p["init"].kind, p["init"].params, p["dtype"], p["ops"]


def generator(seed, name):
    return torch.Generator().manual_seed(reference.derive_seed(seed, name))


# -- 1. legacy constructors and real tensors -------------------------------------

class Legacy(nn.Module):
    """Parameters from legacy constructors, as older models write them."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.FloatTensor(4, 4))
        self.t = nn.Parameter(torch.Tensor(3, 5))
        self.s = nn.Parameter(torch.Tensor(torch.Size([2, 6])))
        self.h = nn.Parameter(torch.DoubleTensor(5))
        self.data = nn.Parameter(torch.Tensor([1.0, 2.5, -3.0]))
        self.register_buffer("index", torch.LongTensor([[0, 2], [1, 3]]))
        self.register_buffer("mask", torch.BoolTensor([True, False, True]))
        self.inside = (isinstance(self.w, torch.FloatTensor), isinstance(self.h, torch.FloatTensor))

    def init_weights(self):
        nn.init.normal_(self.w, std=0.02)
        nn.init.xavier_uniform_(self.t)
        self.s.data.uniform_(-0.1, 0.1)
        with torch.no_grad():
            self.h.fill_(0.5)


def test_legacy_constructors_under_meta_device_make_meta_tensors_that_are_described():
    with mz.meta_device():
        m = Legacy()
    assert all(t.device.type == "meta" for t in m.state_dict().values())
    assert m.h.dtype == torch.float64 and m.index.dtype == torch.int64
    assert m.inside == (False, False)            # meta tensors are not CPU FloatTensors
    spec = mz.describe(m)
    assert steps(spec, "w") == [("normal", {"mean": 0.0, "std": 0.02}, None)]
    assert steps(spec, "t") == [("xavier_uniform", {"gain": 1.0}, None)]
    assert steps(spec, "s") == [("uniform", {"a": -0.1, "b": 0.1}, None)]
    assert steps(spec, "h") == [("constant", {"val": 0.5}, None)]
    # Data given to a legacy constructor keeps its values.
    (kind, p, _), = steps(spec, "data")
    assert kind == "values" and torch.equal(p["data"], torch.tensor([1.0, 2.5, -3.0]))
    (kind, p, _), = steps(spec, "index")
    assert kind == "values" and torch.equal(p["data"], torch.tensor([[0, 2], [1, 3]]))
    (kind, p, _), = steps(spec, "mask")
    assert kind == "values" and torch.equal(p["data"], torch.tensor([True, False, True]))
    # Outside the context, torch's constructors are back.
    assert torch.FloatTensor(2).device.type == "cpu"
    assert torch.Tensor(2).device.type == "cpu"
    assert isinstance(torch.zeros(2), torch.FloatTensor)
    assert "__new__" not in torch.Tensor.__dict__


def test_legacy_data_read_back_in_a_constructor_gives_its_values():
    """Hugging Face's BiT builds `torch.Tensor(np.linspace(...)).split(...)`
    and calls `.tolist()`: values known here are read back as on the CPU."""
    class Rates(nn.Module):
        def __init__(self):
            super().__init__()
            self.rates = [x.tolist() for x in torch.Tensor([0.0, 0.25, 0.5, 0.75]).split([1, 3])]
            self.count = int(torch.arange(5).sum().item())
            self.w = nn.Parameter(torch.ones(2))

    with mz.meta_device():
        m = Rates()
    assert m.rates == [[0.0], [0.25, 0.5, 0.75]] and m.count == 10
    assert steps(mz.describe(m), "w") == [("ones", {}, None)]


def test_legacy_constructors_are_restored_after_an_exception_and_per_thread():
    original = torch.FloatTensor
    with pytest.raises(RuntimeError, match="boom"):
        with mz.meta_device():
            assert torch.FloatTensor(2).device.type == "meta"
            assert isinstance(torch.zeros(2, device="cpu"), torch.FloatTensor)
            seen = {}
            thread = threading.Thread(target=lambda: seen.update(dev=torch.Tensor(2).device.type))
            thread.start()
            thread.join()
            assert seen["dev"] == "cpu"          # another thread keeps torch's
            raise RuntimeError("boom")
    assert torch.FloatTensor is original and "__new__" not in torch.Tensor.__dict__
    assert torch.Tensor(3).device.type == "cpu"


class L(nn.Module):
    """The issue's repro."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.FloatTensor(4, 4))
        self.b = nn.Parameter(torch.empty(4))

    def init_weights(self):
        nn.init.normal_(self.w, std=0.02)
        nn.init.zeros_(self.b)


def test_the_issue_repro_is_described_and_a_real_tensor_is_named_when_not_written():
    with mz.meta_device():
        m = L()
    assert m.w.device.type == "meta"
    assert steps(mz.describe(m), "w") == [("normal", {"mean": 0.0, "std": 0.02}, None)]

    # With torch.device("meta") the legacy constructor still makes a real
    # CPU tensor: the init code writes all of it, so it is described too.
    with torch.device("meta"):
        m = L()
    assert m.w.device.type == "cpu"
    before = m.w.detach().clone()
    spec = mz.describe(m)
    assert steps(spec, "w") == [("normal", {"mean": 0.0, "std": 0.02}, None)]
    assert spec["w"].real and not spec["b"].real
    assert m.w.device.type == "cpu" and matutil.same_bits(m.w.detach(), before)  # unchanged

    # Written only in part: an error naming it, unless keep_real.
    def half(model):
        model.w.data[:2].normal_()
        nn.init.zeros_(model.b)

    with pytest.raises(mz.CaptureError) as e:
        mz.describe(m, init=half)
    (problem,) = e.value.problems
    assert problem.startswith("w (L): a real tensor on cpu") and "keep_real=True" in problem
    spec = mz.describe(m, init=half, keep_real=True)
    assert [t.name for t in spec.tensors] == ["b"]


# -- 2. derived values: elementwise programs over a draw -------------------------------

def dt_bias(n, g, device):
    dt = torch.exp(torch.rand(n, generator=g, device=device, dtype=torch.float32)
                   * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=DT_FLOOR)
    return dt + torch.log(-torch.expm1(-dt))           # the inverse of softplus


# name -> the model's code (n, generator, device) -> values
FORMS = {
    "dt": dt_bias,
    "a_log": lambda n, g, d: torch.log(torch.empty(n, device=d).uniform_(1, 16, generator=g)),
    "softplus": lambda n, g, d: F.softplus(torch.randn(n, generator=g, device=d) * 0.5),
    "rdiv": lambda n, g, d: 1.0 / (torch.rand(n, generator=g, device=d) + 1) ** 2,
    "rsub_sqrt": lambda n, g, d: 2.0 - torch.sqrt(torch.rand(n, generator=g, device=d)),
    "log1p": lambda n, g, d: torch.log1p(torch.rand(n, generator=g, device=d)).div(3.0).sub(0.1),
    "clamp": lambda n, g, d: torch.clamp(torch.randn(n, generator=g, device=d), min=-1.0, max=1.5) / 7,
    "clamp_max": lambda n, g, d: torch.randn(n, generator=g, device=d).clamp_max(0.5).neg(),
    "pow": lambda n, g, d: torch.pow(torch.rand(n, generator=g, device=d) + 0.5, 0.7) - 1,
    "same_draw": lambda n, g, d: (lambda x: x * x.exp() - x / (x + 2))(
        torch.rand(n, generator=g, device=d)),
}
N = 257


class Derived(nn.Module):
    def __init__(self):
        super().__init__()
        for name in FORMS:
            self.register_parameter(name, nn.Parameter(torch.empty(N)))
        self.inplace = nn.Parameter(torch.empty(N))
        self.affine = nn.Parameter(torch.empty(N))

    def init_weights(self):
        with torch.no_grad():
            for name, form in FORMS.items():
                param = getattr(self, name)
                param.copy_(form(N, None, param.device))
            nn.init.uniform_(self.inplace, 0.5, 2.0)        # in place on the model tensor
            self.inplace.log_().clamp_(min=-0.5)
            self.inplace.mul_(3.0)
            self.affine.copy_(torch.randn(N, device=self.affine.device) * 0.02 + 1)


def inplace_code(n, g, device):
    t = torch.empty(n, device=device)
    torch.nn.init.uniform_(t, 0.5, 2.0, generator=g)
    return t.log_().clamp_(min=-0.5).mul_(3.0)


def test_derived_values_are_the_exact_ops_the_code_ran():
    with torch.device("meta"):
        m = Derived()
    spec = mz.describe(m)
    f32 = torch.float32
    assert program(spec, "dt") == ("uniform", {"a": 0.0, "b": 1.0}, f32, [
        {"kind": "mul", "x": 0, "c": math.log(DT_MAX) - math.log(DT_MIN)},
        {"kind": "add", "x": 1, "c": math.log(DT_MIN)},
        {"kind": "exp", "x": 2},
        {"kind": "clamp", "x": 3, "min": DT_FLOOR},
        {"kind": "neg", "x": 4},
        {"kind": "expm1", "x": 5},
        {"kind": "neg", "x": 6},
        {"kind": "log", "x": 7},
        {"kind": "add", "x": 4, "y": 8}])
    assert program(spec, "a_log") == ("uniform", {"a": 1.0, "b": 16.0}, f32,
                                      [{"kind": "log", "x": 0}])
    assert program(spec, "softplus") == ("normal", {"mean": 0.0, "std": 1.0}, f32, [
        {"kind": "mul", "x": 0, "c": 0.5}, {"kind": "softplus", "x": 1}])
    # c / x is what torch's __rdiv__ runs: reciprocal(x) * c.
    assert program(spec, "rdiv")[3] == [
        {"kind": "add", "x": 0, "c": 1.0}, {"kind": "pow", "x": 1, "c": 2.0},
        {"kind": "reciprocal", "x": 2}, {"kind": "mul", "x": 3, "c": 1.0}]
    assert program(spec, "rsub_sqrt")[3] == [
        {"kind": "sqrt", "x": 0}, {"kind": "sub", "x": 1, "c": 2.0, "constant_first": True}]
    assert program(spec, "log1p")[3] == [
        {"kind": "log1p", "x": 0}, {"kind": "div", "x": 1, "c": 3.0},
        {"kind": "sub", "x": 2, "c": 0.1}]
    assert program(spec, "clamp")[3] == [
        {"kind": "clamp", "x": 0, "min": -1.0, "max": 1.5}, {"kind": "div", "x": 1, "c": 7.0}]
    assert program(spec, "clamp_max")[3] == [
        {"kind": "clamp", "x": 0, "max": 0.5}, {"kind": "neg", "x": 1}]
    assert program(spec, "pow")[3] == [
        {"kind": "add", "x": 0, "c": 0.5}, {"kind": "pow", "x": 1, "c": 0.7},
        {"kind": "sub", "x": 2, "c": 1.0}]
    assert program(spec, "same_draw")[3] == [
        {"kind": "exp", "x": 0}, {"kind": "mul", "x": 0, "y": 1},
        {"kind": "add", "x": 0, "c": 2.0}, {"kind": "div", "x": 0, "y": 3},
        {"kind": "sub", "x": 2, "y": 4}]
    assert program(spec, "inplace") == ("uniform", {"a": 0.5, "b": 2.0}, f32, [
        {"kind": "log", "x": 0}, {"kind": "clamp", "x": 1, "min": -0.5},
        {"kind": "mul", "x": 2, "c": 3.0}])
    # A purely affine chain stays one folded scheme.
    assert steps(spec, "affine") == [("normal", {"mean": 1.0, "std": 0.02}, None)]


def test_each_program_in_torch_mode_is_the_models_code_bit_for_bit():
    """reference.init_tensor is the server's torch mode in this process."""
    with torch.device("meta"):
        m = Derived()
    spec = mz.describe(m, seed=11, rng="torch")
    codes = dict(FORMS, inplace=inplace_code)
    for name, code in codes.items():
        want = code(N, generator(11, name), "cpu")
        got = reference.init_tensor(torch.empty(N), spec[name].steps, 11, name)
        assert matutil.same_bits(got, want), name


def test_the_map_and_norm_of_wire_form_round_trips():
    with torch.device("meta"):
        m = Derived()
    spec = mz.describe(m)
    msg = spec.to_proto()
    dt = next(t for t in msg.tensors if t.name == "dt")
    assert not dt.HasField("init") and len(dt.init_steps) == 1      # a map is a step
    (step,) = dt.init_steps
    assert step.init.HasField("uniform") and step.map.dtype == "float32"
    assert [op.kind for op in step.map.ops][:3] == [3, 1, 7]          # MUL, ADD, EXP
    assert step.map.ops[3].HasField("min") and not step.map.ops[3].HasField("max")
    assert step.map.ops[8].WhichOneof("other") == "y" and step.map.ops[8].y == 8
    back = Spec.from_proto(msg)
    assert back.to_proto() == msg
    for desc in spec.roots:
        assert [s.scheme for s in back[desc.name].steps] == [s.scheme for s in desc.steps]


def test_two_different_draws_combined_is_an_error_naming_tensor_and_op():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(8))

        def init_weights(self):
            with torch.no_grad():
                a = torch.rand(8, device="meta")
                b = torch.randn(8, device="meta")
                self.w.copy_(torch.exp(a) + b)

    with torch.device("meta"):
        m = Two()
    with pytest.raises(mz.CaptureError) as e:
        mz.describe(m)
    (problem,) = e.value.problems
    assert problem.startswith("w (Two)") and "two different random draws" in problem, problem


def test_mamba_dt_bias_and_a_log():
    tf = pytest.importorskip("transformers")
    config = tf.MambaConfig(hidden_size=32, state_size=4, num_hidden_layers=2, vocab_size=64,
                            expand=2, conv_kernel=4)
    model = hf.from_config(config, tf.MambaForCausalLM)
    spec = mz.describe(model, seed=3, rng="torch")
    name = "backbone.layers.0.mixer.dt_proj.bias"
    leaf, params, dtype, ops = program(spec, name)
    assert (leaf, params, dtype) == ("uniform", {"a": 0.0, "b": 1.0}, torch.float32)
    assert ops[0] == {"kind": "mul", "x": 0, "c": math.log(config.time_step_max)
                      - math.log(config.time_step_min)}
    assert [op["kind"] for op in ops] == ["mul", "add", "exp", "clamp", "neg", "expm1",
                                         "neg", "log", "add"]
    # A_log = log(arange) expanded over the rows: known values.
    (kind, p, _), = steps(spec, "backbone.layers.0.mixer.A_log")
    want = torch.log(torch.arange(1, 5, dtype=torch.float32))[None, :].expand(64, -1)
    assert kind == "values" and torch.equal(p["data"], want)
    # Torch mode: the model's own expression with the per-tensor generator.
    g = generator(3, name)
    dt = torch.exp(torch.rand(64, generator=g) * (math.log(config.time_step_max)
                                                  - math.log(config.time_step_min))
                   + math.log(config.time_step_min)).clamp(min=config.time_step_floor)
    want = dt + torch.log(-torch.expm1(-dt))
    got = reference.init_tensor(torch.empty(64), spec[name].steps, 3, name)
    assert matutil.same_bits(got, want)


# -- weight normalization -----------------------------------------------------------------

@pytest.mark.parametrize("legacy", [False, True])
def test_weight_norm_g_is_the_norm_of_v(legacy):
    wn = nn.utils.weight_norm if legacy else nn.utils.parametrizations.weight_norm
    with pytest.warns(FutureWarning) if legacy else _nothing():
        with mz.meta_device():
            conv = wn(nn.Conv1d(4, 6, 3), name="weight", dim=2)
    spec = mz.describe(conv, init=False)
    g, v = (("weight_g", "weight_v") if legacy else
            ("parametrizations.weight.original0", "parametrizations.weight.original1"))
    assert steps(spec, g) == [("norm_of", {"tensor": v, "dim": 2}, None)]
    assert steps(spec, v) == [("kaiming_uniform", {"a": math.sqrt(5), "mode": "fan_in",
                                                   "nonlinearity": "leaky_relu"}, None)]
    t = {x.name: x for x in spec.to_proto().tensors}
    assert t[g].init.norm_of.tensor == v and t[g].init.norm_of.dim == 2
    assert Spec.from_proto(spec.to_proto()).to_proto() == spec.to_proto()
    # Parts keep a norm with its source, whatever the order.
    for part in spec.split(1):
        names = {x.name for x in part}
        assert (g in names) == (v in names)
    # Torch mode in this process: g is the norm of v's values.
    tensors = {d.name: torch.empty(d.shape) for d in spec.roots}
    reference.init_spec(tensors, mz.describe(conv, init=False, rng="torch", seed=2))
    assert torch.equal(tensors[g], torch.norm_except_dim(tensors[v], 2, 2))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_norm_of_a_tensor_written_again_afterwards_is_an_error():
    with mz.meta_device():
        conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=0)

    def init(model):
        nn.init.normal_(model.parametrizations.weight.original1)   # v changes, g does not

    with pytest.raises(mz.CaptureError) as e:
        mz.describe(conv, init=init)
    assert any("original0" in p and "taken before the init code wrote" in p
               for p in e.value.problems), e.value.problems


def wav2vec2_config():
    tf = pytest.importorskip("transformers")
    return tf, tf.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, vocab_size=32)


POS = "wav2vec2.encoder.pos_conv_embed.conv."


def test_wav2vec2_weight_norm_is_what_the_cpu_model_ends_with():
    """Hugging Face's `normal_` on `conv.weight` writes the parametrization's
    computed weight, not v: on the CPU, v keeps Conv1d's kaiming_uniform
    and g is its norm."""
    tf, config = wav2vec2_config()
    torch.manual_seed(0)
    cpu = tf.Wav2Vec2ForCTC(config)
    g = cpu.wav2vec2.encoder.pos_conv_embed.conv.parametrizations.weight.original0
    v = cpu.wav2vec2.encoder.pos_conv_embed.conv.parametrizations.weight.original1
    assert torch.equal(g, torch.norm_except_dim(v, 2, 2))
    bound = 1 / math.sqrt(v.shape[1] * v.shape[2])
    assert v.abs().max() <= bound and v.abs().max() > 0.95 * bound    # uniform, not normal

    spec = mz.describe(hf.from_config(config, tf.Wav2Vec2ForCTC))
    assert steps(spec, POS + "parametrizations.weight.original0") == [
        ("norm_of", {"tensor": POS + "parametrizations.weight.original1", "dim": 2}, None)]
    assert steps(spec, POS + "parametrizations.weight.original1") == [
        ("kaiming_uniform", {"a": math.sqrt(5), "mode": "fan_in",
                             "nonlinearity": "leaky_relu"}, None)]


# -- 3. known values through any view ---------------------------------------------------------

def test_known_values_through_views_that_are_not_boxes():
    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.a_log = nn.Parameter(torch.empty(6, 4))
            self.rep = nn.Parameter(torch.empty(2, 6))
            self.tr = nn.Parameter(torch.empty(3, 2))
            self.strided = nn.Parameter(torch.empty(8))
            self.diag = nn.Parameter(torch.empty(3, 3))

        def init_weights(self):
            d = self.a_log.device
            with torch.no_grad():
                a = torch.arange(1, 5, dtype=torch.float32, device=d)[None, :].expand(6, -1).contiguous()
                self.a_log.copy_(torch.log(a))
                self.rep.copy_(torch.arange(3.0, device=d).repeat(2, 2))
                self.tr.copy_(torch.arange(6.0, device=d).reshape(2, 3).t())
                self.strided.zero_()
                self.strided[::2] = torch.arange(4.0, device=d) + 1   # a non-box view
                self.diag.zero_()
                self.diag.diagonal().fill_(2.0)

    with torch.device("meta"):
        m = Views()
    spec = mz.describe(m)
    with torch.no_grad():
        cpu = Views()
        cpu.init_weights()
    for name in ("a_log", "rep", "tr", "strided", "diag"):
        (step,) = spec[name].steps
        t = reference.init_tensor(torch.empty(spec[name].shape), [step], 0, name)
        assert torch.equal(t, getattr(cpu, name).detach()), name


def test_a_non_box_write_over_unknown_values_names_tensor_and_op():
    class Strided(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(8))

        def init_weights(self):
            nn.init.normal_(self.w)
            with torch.no_grad():
                self.w[::2] = 0.0

    with torch.device("meta"):
        m = Strided()
    with pytest.raises(mz.CaptureError) as e:
        mz.describe(m)
    (problem,) = e.value.problems
    assert problem.startswith("w (Strided)") and "not a box" in problem, problem


# -- 4. init code that reshapes and views model tensors -----------------------------------------

def test_init_code_that_transposes_temporaries_records_with_torchs_shapes():
    """torch.nn.init.orthogonal_ on a non-square matrix transposes its
    temporary in place (t_()); the recorder ran none of it, so the
    temporary kept its shape and `tensor.view_as(q)` failed inside
    (RWKV's init raised `shape '[64, 64]' is invalid for input of size
    8192`)."""
    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(64, 128, bias=False)       # weight [128, 64]
            self.down = nn.Linear(128, 64, bias=False)     # weight [64, 128]
            self.scratch = nn.Parameter(torch.empty(4, 6))

        def init_weights(self):
            nn.init.orthogonal_(self.up.weight, gain=2.0)
            nn.init.orthogonal_(self.down.weight)
            with torch.no_grad():
                t = torch.arange(24.0, device=self.scratch.device).reshape(6, 4)
                t.t_()
                t.unsqueeze_(0).squeeze_(0)
                self.scratch.copy_(t)

    with torch.device("meta"):
        m = Wide()
    spec = mz.describe(m)
    assert steps(spec, "up.weight") == [("orthogonal", {"gain": 2.0}, None)]
    assert steps(spec, "down.weight") == [("orthogonal", {"gain": 1.0}, None)]
    (kind, p, _), = steps(spec, "scratch")
    assert kind == "values" and torch.equal(p["data"], torch.arange(24.0).reshape(6, 4).t())


def test_rwkv_is_described():
    tf = pytest.importorskip("transformers")
    config = tf.RwkvConfig(hidden_size=64, num_hidden_layers=2, vocab_size=512,
                           intermediate_size=128, attention_hidden_size=64, context_length=64)
    spec = mz.describe(hf.from_config(config, tf.RwkvModel))
    assert steps(spec, "blocks.0.feed_forward.key.weight") == [
        ("orthogonal", {"gain": math.sqrt(2.0)}, None)]


# -- with a server ----------------------------------------------------------------------------------

def _named(model):
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


def test_derived_model_materialized_in_torch_mode_is_its_code_bit_for_bit(server):
    with torch.device("meta"):
        m = Derived()
    mz.materialize(m, server=server.address, seed=7, rng="torch", transport="stream")
    codes = dict(FORMS, inplace=inplace_code)
    for name, code in codes.items():
        want = code(N, generator(7, name), "cpu")
        assert matutil.same_bits(getattr(m, name).detach(), want), name
    server.assert_idle()


def test_derived_model_materialized_in_portable_mode_follows_the_formulas(server):
    with torch.device("meta"):
        m = Derived()
    mz.materialize(m, server=server.address, seed=7, transport="stream")
    # dt bias: softplus gives back dt, which is log-uniform in [min, max]
    # (clamped at the floor).
    dt = F.softplus(m.dt.detach().double())
    assert torch.all(dt >= DT_MIN * (1 - 1e-4)) and torch.all(dt <= DT_MAX * (1 + 1e-4))
    u = (torch.log(dt) - math.log(DT_MIN)) / (math.log(DT_MAX) - math.log(DT_MIN))
    assert abs(u.mean().item() - 0.5) < 0.1
    a = torch.exp(m.a_log.detach())
    assert torch.all(a >= 1 - 1e-5) and torch.all(a <= 16 + 1e-4) and abs(a.mean() - 8.5) < 1.5
    assert torch.all(m.softplus > 0) and torch.all(m.clamp <= 1.5 / 7 + 1e-6)
    assert torch.all(m.clamp >= -1.0 / 7 - 1e-6)
    assert torch.all(m.inplace >= -1.5 - 1e-5) and torch.all(m.inplace <= 3 * math.log(2) + 1e-5)
    assert abs(m.affine.mean().item() - 1.0) < 0.01
    server.assert_idle()


def test_legacy_model_materialized_has_no_garbage(server):
    with mz.meta_device():
        m = Legacy()
    mz.materialize(m, server=server.address, seed=5, rng="torch", transport="stream")
    assert torch.equal(m.data.detach(), torch.tensor([1.0, 2.5, -3.0]))
    assert torch.equal(m.index, torch.tensor([[0, 2], [1, 3]]))
    assert torch.equal(m.h.detach(), torch.full((5,), 0.5, dtype=torch.float64))
    want = torch.nn.init.normal_(torch.empty(4, 4), 0.0, 0.02, generator=generator(5, "w"))
    assert matutil.same_bits(m.w.detach(), want)
    # A real tensor that describe() described is replaced (the Parameter kept).
    with torch.device("meta"):
        r = L()
    w = r.w
    assert w.device.type == "cpu"
    mz.materialize(r, server=server.address, seed=5, rng="torch", transport="stream")
    assert r.w is w and matutil.same_bits(r.w.detach(), want)
    assert torch.equal(r.b.detach(), torch.zeros(4))
    server.assert_idle()


def test_mamba_materialized_in_torch_mode(server):
    tf = pytest.importorskip("transformers")
    config = tf.MambaConfig(hidden_size=32, state_size=4, num_hidden_layers=2, vocab_size=64,
                            expand=2, conv_kernel=4)
    model = hf.from_config(config, tf.MambaForCausalLM)
    r = mz.materialize(model, server=server.address, seed=9, rng="torch", transport="stream")
    named = _named(model)
    for layer in range(2):
        name = f"backbone.layers.{layer}.mixer.dt_proj.bias"
        g = generator(9, name)
        dt = torch.exp(torch.rand(64, generator=g) * (math.log(config.time_step_max)
                                                      - math.log(config.time_step_min))
                       + math.log(config.time_step_min)).clamp(min=config.time_step_floor)
        assert matutil.same_bits(named[name].detach(), dt + torch.log(-torch.expm1(-dt))), name
        a = torch.arange(1, 5, dtype=torch.float32)[None, :].expand(64, -1)
        assert torch.equal(named[f"backbone.layers.{layer}.mixer.A_log"].detach(), torch.log(a))
    for desc in r.spec.roots:
        want = reference.init_tensor(torch.empty(desc.shape, dtype=desc.dtype),
                                     desc.steps, 9, desc.name)
        assert matutil.same_bits(named[desc.name].detach(), want), desc.name
    server.assert_idle()


@pytest.mark.parametrize("rng", ["torch", "portable"])
def test_wav2vec2_materialized_g_is_the_norm_of_v(server, rng):
    tf, config = wav2vec2_config()
    model = hf.from_config(config, tf.Wav2Vec2ForCTC)
    mz.materialize(model, server=server.address, seed=4, rng=rng, transport="stream")
    named = _named(model)
    g = named[POS + "parametrizations.weight.original0"].detach()
    v = named[POS + "parametrizations.weight.original1"].detach()
    norm = torch.norm_except_dim(v, 2, 2)
    if rng == "torch":
        want = torch.nn.init.kaiming_uniform_(torch.empty(v.shape), a=math.sqrt(5),
                                              generator=generator(4, POS + "parametrizations.weight.original1"))
        assert matutil.same_bits(v, want)
        assert matutil.same_bits(g, norm)
    else:
        torch.testing.assert_close(g, norm, rtol=1e-5, atol=0)
    bound = 1 / math.sqrt(v.shape[1] * v.shape[2])
    assert v.abs().max() <= bound
    server.assert_idle()
