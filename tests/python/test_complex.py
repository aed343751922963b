"""complex64 tensors: rotary tables that models keep as complex numbers
(Llama 4's vision `freqs_ci`). The service holds them with deterministic
inits only (values computed by the model's code, zeros, ones, a constant,
empty) and delivers their bytes like any other dtype: through the SDK's
transports, in safetensors (`C64`) and torch's zip format
(`ComplexFloatStorage`), and from checkpoints. A random init of a
complex tensor is refused, naming the tensor, with nothing held."""

import io
import json
import struct

import grpc
import pytest
import torch
import torch.nn as nn

import materializer as mz
import serverproc
from materializer import hf

safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("complex") / "ckpts"
    base.mkdir()
    return base


@pytest.fixture(scope="module")
def srv(root):
    with serverproc.running_server(extra_args=(f"--checkpoint_roots=ckpts={root}",)) as s:
        yield s


def rotary(n, dim):
    """A rotary table as models compute it: e^(i * position * frequency)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(n).float(), inv)
    return torch.polar(torch.ones_like(angles), angles)


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("freqs_cis", rotary(12, 16))            # persistent
        self.register_buffer("table", torch.view_as_complex(          # non-persistent
            torch.stack([torch.cos(torch.arange(6.0)), torch.sin(torch.arange(6.0))], -1)),
            persistent=False)
        self.register_buffer("zeroed", torch.zeros(5, dtype=torch.complex64))


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    return torch.equal(torch.view_as_real(a).view(torch.int32),
                       torch.view_as_real(b).view(torch.int32))


def bits_of(t):
    return torch.view_as_real(t.contiguous()).numpy().tobytes()


@pytest.mark.parametrize("transport", ["stream", "shm"])
def test_a_complex_buffer_arrives_with_the_models_own_values(srv, transport):
    with mz.meta_device():
        model = Rotary()
    spec = mz.describe(model)
    assert spec["freqs_cis"].dtype == torch.complex64
    assert spec["freqs_cis"].steps[0].scheme.kind == "values"
    assert spec["zeroed"].steps[0].scheme.kind == "zeros"
    mz.materialize(model, server=srv.address, transport=transport)
    cpu = Rotary()
    for name in ("freqs_cis", "table", "zeroed"):
        got = getattr(model, name)
        assert got.device.type == "cpu" and got.dtype == torch.complex64, name
        assert same_bits(got, getattr(cpu, name)), name
    # The trainer can use and write it as a complex tensor.
    model.freqs_cis.mul_(2)
    assert same_bits(model.freqs_cis, cpu.freqs_cis * 2)
    srv.assert_idle()


def test_llama4_vision_rotary_table_equals_the_cpu_build(srv):
    """The Hugging Face class whose complex buffer used to refuse the whole
    model: freqs_ci, computed by transformers' own code, bit for bit, and
    the forward pass of the materialized model equals the CPU build's once
    both hold the same weights."""
    tf = pytest.importorskip("transformers")
    config = tf.Llama4VisionConfig(hidden_size=64, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   image_size=56, patch_size=14,
                                   projector_input_dim=64, projector_output_dim=64,
                                   vision_output_dim=64)
    torch.manual_seed(0)
    cpu = tf.Llama4VisionModel(config).eval()
    model = hf.from_config(config, tf.Llama4VisionModel)
    mz.materialize(model, server=srv.address)
    model.eval()
    got = model.rotary_embedding.freqs_ci
    want = cpu.rotary_embedding.freqs_ci
    assert got.dtype == torch.complex64 and got.shape == want.shape
    assert same_bits(got, want)
    # Same weights, same outputs: the table is what the attention uses.
    model.load_state_dict(cpu.state_dict())
    pixels = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        a = model(pixels).last_hidden_state
        b = cpu(pixels).last_hidden_state
    assert torch.equal(a, b)
    srv.assert_idle()


def values_request(srv, name, data, placement="cpu"):
    return srv.parse_request(json.dumps({
        "model": {"tensors": [
            {"name": name, "shape": list(data.shape), "dtype": "complex64",
             "kind": "TENSOR_KIND_BUFFER"},
            {"name": "w", "shape": [4, 4], "dtype": "float32"}],
            "initRules": [{"pattern": "w", "init": {"normal": {"std": 0.5}}}]},
        "placement": {"device": placement}}))


def with_values(req, name, data):
    for t in req.model.tensors:
        if t.name == name:
            t.init.values.data = bits_of(data)
    return req


def test_fetch_formats_load_with_the_ecosystems_readers(srv):
    table = rotary(7, 10)
    req = with_values(values_request(srv, "rope.freqs_cis", table), "rope.freqs_cis", table)
    with srv.handle(req) as resp:
        info = {t.name: t for t in srv.describe(resp.handle).tensors}
        assert info["rope.freqs_cis"].dtype == "complex64"
        assert list(info["rope.freqs_cis"].shape) == [7, 5]
        st = srv.fetch(resp.handle, format=srv.pb.WEIGHT_FORMAT_SAFETENSORS)
        header = json.loads(st[8:8 + struct.unpack("<Q", st[:8])[0]])
        assert header["rope.freqs_cis"]["dtype"] == "C64"
        loaded = safetensors_torch.load(st)
        assert same_bits(loaded["rope.freqs_cis"], table)
        zipped = srv.fetch(resp.handle, format=srv.pb.WEIGHT_FORMAT_TORCH)
        state = torch.load(io.BytesIO(zipped), weights_only=True)
        assert same_bits(state["rope.freqs_cis"], table)
        assert torch.equal(state["w"], loaded["w"])
    srv.assert_idle()


@pytest.mark.parametrize("scheme", [
    {"normal": {"std": 0.02}}, {"uniform": {}}, {"kaimingUniform": {}},
    {"arange": {}}, {"moduleDefault": {}}])
def test_a_drawn_or_computed_init_of_a_complex_tensor_is_refused(srv, scheme):
    req = srv.parse_request(json.dumps({"model": {"tensors": [
        {"name": "w", "shape": [4, 4], "dtype": "float32"},
        {"name": "rope.freqs", "shape": [8, 4], "dtype": "complex64",
         "moduleType": "Linear", "init": scheme}]}}))
    with pytest.raises(grpc.RpcError) as e:
        srv.materialize(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rope.freqs" in e.value.details()
    assert "complex64" in e.value.details()
    srv.assert_idle()


def test_complex_values_with_a_nan_part_are_refused(srv):
    table = rotary(3, 4)
    table[1, 1] = complex(0.5, float("nan"))
    req = with_values(values_request(srv, "t", table), "t", table)
    with pytest.raises(grpc.RpcError) as e:
        srv.materialize(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "element 3 is NaN" in e.value.details(), e.value.details()
    srv.assert_idle()


def test_constant_and_ones_fill_the_real_part(srv):
    req = srv.parse_request(json.dumps({"model": {"tensors": [
        {"name": "a", "shape": [3], "dtype": "complex64", "init": {"constant": {"val": -2.5}}},
        {"name": "b", "shape": [2], "dtype": "complex64", "init": {"ones": {}}}]}}))
    with srv.handle(req) as resp:
        state = safetensors_torch.load(srv.fetch(resp.handle))
    assert same_bits(state["a"], torch.full((3,), -2.5, dtype=torch.complex64))
    assert same_bits(state["b"], torch.ones(2, dtype=torch.complex64))


def test_describe_refuses_a_random_init_of_a_complex_parameter():
    class Drawn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Parameter(torch.empty(4, 4, dtype=torch.complex64))

        def init_weights(self):
            nn.init.normal_(self.c)

    with mz.meta_device():
        model = Drawn()
    with pytest.raises(mz.CaptureError, match=r"c \(Drawn\): normal on a torch\.complex64 "
                                              r"tensor; complex tensors take only values"):
        mz.describe(model)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_complex_tensor_loads_from_a_checkpoint(srv, root, fmt):
    """A checkpoint holding a complex table (as torch.save and safetensors
    write it) fills the model's complex buffer; the linear comes from the
    file too."""
    torch.manual_seed(5)
    src = Rotary()
    src.freqs_cis.mul_(1.5)   # not the model's own values: they must come from the file
    folder = root / f"rotary-{fmt}"
    folder.mkdir(exist_ok=True)
    state = {k: v for k, v in src.state_dict().items()}
    if fmt == "safetensors":
        safetensors_torch.save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    with mz.meta_device():
        model = Rotary()
    r = mz.materialize(model, server=srv.address, checkpoint=f"ckpts/{folder.name}")
    assert same_bits(model.freqs_cis, src.freqs_cis)
    assert torch.equal(model.proj.weight, src.proj.weight)
    assert same_bits(model.table, Rotary().table)      # not in the file: its init
    assert r.checkpoint.tensors_loaded == 4        # proj.weight, proj.bias, freqs_cis, zeroed
    srv.assert_idle()


def test_a_checkpoint_cannot_cast_complex_to_real(srv, root):
    folder = root / "rotary-real"
    folder.mkdir(exist_ok=True)
    state = dict(Rotary().state_dict())
    state["freqs_cis"] = torch.view_as_real(state["freqs_cis"])[..., 0].contiguous()
    safetensors_torch.save_file(state, str(folder / "model.safetensors"))
    with mz.meta_device():
        model = Rotary()
    with pytest.raises(mz.RpcError) as e:
        mz.materialize(model, server=srv.address, checkpoint="ckpts/rotary-real")
    assert "freqs_cis" in str(e.value) and "complex64" in str(e.value), str(e.value)
    srv.assert_idle()
