"""Materialize -> FetchWeights -> safetensors.torch.load_file, checked
against the request and against torch's own generators, bit for bit."""

import json
import math
import random

import pytest
import safetensors.torch
import torch

import matutil as m

SAFETENSORS_DTYPES = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
    "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def fetch_to_file(server, handle, tmp_path, fname, **kw):
    blob = server.fetch(handle, **kw)
    path = tmp_path / fname
    path.write_bytes(blob)
    return blob, safetensors.torch.load_file(str(path))


def check_layout(blob, spec_by_name):
    """The header follows the documented deterministic layout."""
    header, data_start = m.safetensors_header(blob)
    assert (data_start - 8) % 8 == 0, "header not padded to a multiple of 8"
    header.pop("__metadata__", None)
    esize = {n: torch.empty((), dtype=m.TORCH_DTYPES[t["dtype"]]).element_size()
             for n, t in spec_by_name.items()}
    names = list(header)
    # Ordered by element size (largest first), then by name; the JSON
    # object order is the file order.
    by_offset = sorted(names, key=lambda n: header[n]["data_offsets"][0])
    assert by_offset == sorted(names, key=lambda n: (-esize[n], n))
    pos = 0
    for n in by_offset:
        begin, end = header[n]["data_offsets"]
        assert begin == pos, (n, begin, pos)
        assert begin % esize[n] == 0, f"{n} misaligned"
        assert header[n]["dtype"] == SAFETENSORS_DTYPES[spec_by_name[n]["dtype"]]
        assert header[n]["shape"] == list(spec_by_name[n]["shape"])
        assert end - begin == m.numel(spec_by_name[n]["shape"]) * esize[n]
        pos = end
    assert data_start + pos == len(blob), "trailing or missing bytes"
    return header


# Relative slack on the sample std for the generating dtype. torch's own
# normal_ in bfloat16 comes out ~0.65% narrow (std 0.01987 for 0.02 on
# 16M samples): the service reproduces torch bit for bit, bias included.
STD_SLACK = {torch.bfloat16: 1e-2, torch.float16: 3e-3}


def check_normal_stats(name, t, mean, std):
    x = t.double()
    n = x.numel()
    tol_mean = 6 * std / math.sqrt(n)
    tol_std = 6 * std / math.sqrt(2 * n) + STD_SLACK.get(t.dtype, 1e-3) * std
    assert abs(x.mean().item() - mean) < tol_mean, name
    assert abs(x.std().item() - std) < tol_std, name


def check_tensors(loaded, model, dtype_filter=None):
    """Values: exact for zeros/ones/constant, bit-for-bit reference (torch's
    generators in torch mode, the NumPy Philox reference in portable mode)
    and plausible moments for normal/uniform."""
    seed = int(model.get("seed", "0"))
    torch_mode = model.get("rng") == "RNG_MODE_TORCH"
    inits = m.resolve_inits(model)
    for t in model["tensors"]:
        name = t["name"]
        if name not in loaded:
            continue
        got = loaded[name]
        scheme, params = inits[name]
        if scheme == "zeros":
            assert torch.count_nonzero(got).item() == 0, name
        elif scheme == "ones":
            assert bool((got == 1).all()), name
        if scheme == "normal":
            check_normal_stats(name, got, params.get("mean", 0.0),
                               params.get("std", 1.0))
        if scheme == "uniform":
            assert got.min().item() >= params["a"], name
            assert got.max().item() <= params["b"], name
        # A tied tensor holds its root's values, drawn with the root's seed.
        if torch_mode:
            want = m.reference(t["shape"], m.TORCH_DTYPES[t["dtype"]], scheme,
                               params, seed, m.tie_root(model, name))
        else:
            want = m.portable_reference(t["shape"], t["dtype"], scheme, params,
                                        seed, m.tie_root(model, name))
        # Bit for bit (view as integers so -0.0 / NaN cannot hide).
        assert m.same_bits(got, want), (
            f"{name}: differs from torch reference ({scheme} {params})")


def test_gpt2_small_roundtrip(server, tmp_path):
    model_json = m.load_json("gpt2-small.json")
    specs = {t["name"]: t for t in model_json["model"]["tensors"]}
    req = server.example("gpt2-small.json")
    with server.handle(req) as resp:
        assert resp.handle.startswith("h-") and len(resp.handle) == 34
        assert resp.state == server.pb.HANDLE_STATE_READY
        assert resp.num_tensors == len(specs) == 149  # + the tied lm_head
        assert resp.tensor_bytes == 124_439_808 * 4
        assert resp.arena_bytes >= resp.tensor_bytes
        assert resp.device.startswith("cpu")

        info = server.describe(resp.handle)
        assert info.state == server.pb.HANDLE_STATE_READY
        assert info.owner == "anonymous"
        assert info.seed == 1234
        assert [t.name for t in info.tensors] == list(specs)

        st = server.stats()
        assert st.handles == 1 and st.in_use_bytes == resp.arena_bytes

        blob, loaded = fetch_to_file(server, resp.handle, tmp_path, "gpt2.safetensors")

    check_layout(blob, specs)
    assert set(loaded) == set(specs)
    for name, t in specs.items():
        assert list(loaded[name].shape) == t["shape"], name
        assert loaded[name].dtype == torch.float32, name
    # Spot checks of the GPT-2 scheme, then every tensor against torch.
    assert torch.count_nonzero(loaded["transformer.h.0.attn.c_attn.bias"]) == 0
    assert bool((loaded["transformer.ln_f.weight"] == 1).all())
    check_normal_stats("wte", loaded["transformer.wte.weight"], 0.0, 0.02)
    check_tensors(loaded, model_json["model"])
    del loaded, blob
    server.assert_idle()


def test_llama_small_bf16_and_non_persistent_buffers(server, tmp_path):
    model_json = m.load_json("llama-small.json")
    specs = {t["name"]: t for t in model_json["model"]["tensors"]}
    inv = {n for n, t in specs.items() if n.endswith(".rotary_emb.inv_freq")}
    assert len(inv) == 8
    req = server.example("llama-small.json")
    with server.handle(req, client="llama-test") as resp:
        assert resp.state == server.pb.HANDLE_STATE_READY
        assert resp.num_tensors == len(specs)

        info = server.describe(resp.handle, client="llama-test")
        by_name = {t.name: t for t in info.tensors}
        some_inv = sorted(inv)[0]
        assert by_name[some_inv].kind == server.pb.TENSOR_KIND_BUFFER
        assert not by_name[some_inv].persistent
        assert by_name["model.norm.weight"].persistent

        blob, loaded = fetch_to_file(server, resp.handle, tmp_path, "a.safetensors",
                                     client="llama-test")
        assert set(loaded) == set(specs) - inv
        check_layout(blob, {n: specs[n] for n in loaded})
        for name in loaded:
            assert loaded[name].dtype == torch.bfloat16, name
            assert list(loaded[name].shape) == specs[name]["shape"], name
        check_tensors(loaded, model_json["model"])

        blob2, loaded2 = fetch_to_file(server, resp.handle, tmp_path, "b.safetensors",
                                       client="llama-test",
                                       include_non_persistent=True)
        assert set(loaded2) == set(specs)
        check_layout(blob2, specs)
        # RoPE: inv_freq[i] = 1 / 10000^(2i / 64), computed as LLaMA does.
        want_inv = m.rope_inv_freq(10000.0, 64)
        for name in inv:
            assert loaded2[name].dtype == torch.float32
            assert list(loaded2[name].shape) == [32]
            assert m.same_bits(loaded2[name], want_inv), name
        # lm_head is tied to the embedding: one storage, both names written.
        assert m.same_bits(loaded["lm_head.weight"],
                           loaded["model.embed_tokens.weight"])
        for name in loaded:
            assert m.same_bits(loaded[name], loaded2[name]), name
    server.assert_idle()
    server.assert_idle(client="llama-test")


def _tensor_bytes(loaded):
    return {n: t.clone() for n, t in loaded.items()}


def test_values_do_not_depend_on_order_or_other_tensors(server, tmp_path):
    """Per-tensor seeding: shuffling the request, or dropping tensors,
    changes no tensor's values; the file layout does not depend on the
    request order either."""
    model_json = m.load_json("mlp.json")
    base = server.example("mlp.json")
    with server.handle(base) as resp:
        blob, loaded = fetch_to_file(server, resp.handle, tmp_path, "base.safetensors")
    check_tensors(loaded, model_json["model"])
    want = _tensor_bytes(loaded)

    shuffled = json.loads(json.dumps(model_json))
    random.Random(5).shuffle(shuffled["model"]["tensors"])
    with server.handle(server.parse_request(json.dumps(shuffled))) as resp:
        blob2 = server.fetch(resp.handle)
    assert blob2 == blob

    subset = json.loads(json.dumps(model_json))
    subset["model"]["tensors"] = subset["model"]["tensors"][::3]
    with server.handle(server.parse_request(json.dumps(subset))) as resp:
        _, loaded3 = fetch_to_file(server, resp.handle, tmp_path, "sub.safetensors")
    assert set(loaded3) == {t["name"] for t in subset["model"]["tensors"]}
    for n, t in loaded3.items():
        assert m.same_bits(t, want[n]), n

    other_seed = json.loads(json.dumps(model_json))
    other_seed["model"]["seed"] = "1235"
    with server.handle(server.parse_request(json.dumps(other_seed))) as resp:
        _, loaded4 = fetch_to_file(server, resp.handle, tmp_path, "seed.safetensors")
    assert not torch.equal(loaded4["net.fc0.weight"], loaded["net.fc0.weight"])
    check_tensors(loaded4, other_seed["model"])
    server.assert_idle()


SMALL_DTYPES = ["float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("scheme", ["normal", "uniform", "constant"])
def test_other_dtypes_match_torch(server, tmp_path, scheme):
    """float64/float16/bfloat16/float8 (float8 generated in float32 and then
    converted) equal torch's results bit for bit."""
    init = {"normal": {"normal": {"mean": 0.5, "std": 2.0}},
            "uniform": {"uniform": {"a": -3.0, "b": 1.5}},
            "constant": {"constant": {"val": 0.75}}}[scheme]
    tensors = [{"name": f"t.{dt}", "shape": [3, 257], "dtype": dt}
               for dt in SMALL_DTYPES]
    tensors.append({"name": "t.scalar", "shape": [], "dtype": "float32"})
    tensors.append({"name": "t.empty", "shape": [0, 5], "dtype": "float32"})
    model = {"tensors": tensors, "initRules": [{"pattern": "*", "init": init}],
             "seed": str(2**64 - 3), "rng": "RNG_MODE_TORCH"}
    req = server.parse_request(json.dumps({"model": model, "label": scheme}))
    with server.handle(req) as resp:
        _, loaded = fetch_to_file(server, resp.handle, tmp_path, "d.safetensors")
    assert set(loaded) == {t["name"] for t in tensors}
    for t in tensors:
        got = loaded[t["name"]]
        assert got.dtype == m.TORCH_DTYPES[t["dtype"]]
        assert list(got.shape) == t["shape"]
    # Moments are meaningless on 771 float8 samples; the bitwise check is
    # the real one.
    for t in tensors:
        (s, p), = init.items()
        want = m.reference(t["shape"], m.TORCH_DTYPES[t["dtype"]], s, p,
                           2**64 - 3, t["name"])
        assert m.same_bits(loaded[t["name"]], want), t["name"]
    server.assert_idle()


def test_plan_allocates_nothing_and_matches_materialize(server):
    pb = server.pb
    mreq = server.example("gpt2-small.json")
    plan = server.stub.Plan(pb.PlanRequest(model=mreq.model,
                                           placement=mreq.placement), timeout=60)
    assert plan.tensor_bytes == 124_439_808 * 4
    assert plan.num_elements == 124_439_808
    assert plan.arena_bytes >= plan.tensor_bytes
    assert plan.largest_tensor == "transformer.wte.weight"
    assert plan.largest_tensor_bytes == 50257 * 768 * 4
    assert [(d.dtype, d.nbytes, d.tensors) for d in plan.by_dtype] == [
        ("float32", 124_439_808 * 4, 149)]
    assert [t.name for t in plan.tensors] == [t.name for t in mreq.model.tensors]
    assert plan.placement.startswith("cpu")
    assert not plan.warnings
    by_name = {t.name: t for t in plan.tensors}
    assert "normal" in by_name["transformer.h.0.attn.c_attn.weight"].init
    assert "ones" in by_name["transformer.h.0.ln_1.weight"].init
    assert "zeros" in by_name["transformer.h.0.ln_1.bias"].init
    assert by_name["lm_head.weight"].tied_to == "transformer.wte.weight"
    assert (by_name["lm_head.weight"].arena_offset
            == by_name["transformer.wte.weight"].arena_offset)
    server.assert_idle()
    with server.handle(mreq) as resp:
        assert resp.arena_bytes == plan.arena_bytes
        assert resp.tensor_bytes == plan.tensor_bytes
        info = server.describe(resp.handle)
        assert [(t.name, t.arena_offset, t.nbytes) for t in info.tensors] == [
            (t.name, t.arena_offset, t.nbytes) for t in plan.tensors]
    server.assert_idle()


def test_a_summary_only_plan_is_the_plan_without_its_listing(server):
    """PlanRequest.summary_only: every field of the full plan but the
    per-tensor listing, for a split placement too (whose listing says which
    device each tensor goes to)."""
    pb = server.pb
    mreq = server.example("gpt2-small.json")
    for placement in (mreq.placement, pb.Placement(device="split")):
        full = server.stub.Plan(pb.PlanRequest(model=mreq.model, placement=placement),
                                timeout=60)
        summary = server.stub.Plan(pb.PlanRequest(model=mreq.model, placement=placement,
                                                  summary_only=True), timeout=60)
        assert len(full.tensors) == 149 and len(summary.tensors) == 0
        full.ClearField("tensors")
        assert summary == full
        assert summary.largest_tensor == "transformer.wte.weight"
        assert summary.by_dtype[0].tensors == 149
    server.assert_idle()


def test_unused_rule_is_a_warning(server):
    req = {"model": {"tensors": [{"name": "w", "shape": [2], "dtype": "float32"}],
                     "initRules": [{"pattern": "nothing.*", "init": {"ones": {}}},
                                   {"pattern": "*", "init": {"zeros": {}}}]}}
    with server.handle(server.parse_request(json.dumps(req))) as resp:
        assert any("nothing.*" in w for w in resp.warnings), resp.warnings
    server.assert_idle()


def test_async_materialize_gives_the_same_bytes(server):
    import time
    pb = server.pb
    req = server.example("mlp.json")
    with server.handle(req) as resp:
        want = server.fetch(resp.handle)
    setattr(req, "async", True)  # `async` is a Python keyword
    resp = server.materialize(req)
    try:
        assert resp.state in (pb.HANDLE_STATE_MATERIALIZING, pb.HANDLE_STATE_READY)
        deadline = time.monotonic() + 60
        while server.describe(resp.handle).state == pb.HANDLE_STATE_MATERIALIZING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        info = server.describe(resp.handle)
        assert info.state == pb.HANDLE_STATE_READY, info.error
        assert all(t.device.startswith("cpu") for t in info.tensors)
        assert server.fetch(resp.handle) == want
    finally:
        server.release(resp.handle)
    server.assert_idle()
