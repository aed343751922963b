"""Assembled tensors (CheckpointSource.assemblies; docs/checkpoints.md):
a tensor built from boxes of several checkpoint tensors, as transformers'
conversions build a mixture-of-experts weight from experts stored one by
one. Each assembled tensor must equal what torch.stack / torch.cat /
torch.chunk make of the stored tensors, bit for bit (and after a bfloat16
-> float32 cast, torch's cast), a shard must read only the experts of its
box, and every malformed assembly is refused naming the field with
nothing held."""


import pytest
import torch

import grpc
from safetensors.torch import save_file

import matutil as m
import serverproc

CLIENT = "assembly"
E, I, H = 4, 6, 10   # experts, intermediate, hidden
BIG_E = 8


def stored_tensors():
    g = torch.Generator().manual_seed(11)
    sd = {}
    for e in range(E):
        for w in ("w1", "w3"):
            sd[f"experts.{e}.{w}.weight"] = torch.randn(I, H, generator=g)
        sd[f"experts.{e}.w2.weight"] = torch.randn(H, I, generator=g)
    sd["attn.qkv.weight"] = torch.randn(3 * H, H, generator=g)
    sd["norm.weight"] = torch.randn(H, generator=g)
    return sd


@pytest.fixture(scope="module")
def stored():
    return stored_tensors()


@pytest.fixture(scope="module")
def root(tmp_path_factory, stored):
    base = tmp_path_factory.mktemp("assembly-root") / "models"
    base.mkdir()
    save_file(stored, str(base / "moe.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in stored.items()},
              str(base / "moe-bf16.safetensors"))
    # Experts of 4 MiB each (the server reads whole 4 MiB blocks): enough
    # of them that a shard's reads can be told from the whole file's.
    save_file({f"experts.{e}.w.weight": torch.full((1024, 1024), float(e))
               for e in range(BIG_E)}, str(base / "big.safetensors"))
    return base


@pytest.fixture(scope="module")
def server(root):
    with serverproc.running_server(extra_args=(
            f"--checkpoint_roots=models={root}", "--checkpoint_cache_bytes=0")) as srv:
        yield srv


def whole_part(key, offset, shape):
    return {"key": key, "offset": offset, "shape": shape}


def gate_up_assembly(name="mlp.gate_up_proj"):
    """[E, 2I, H]: expert e's w1 in rows [0, I), its w3 in [I, 2I)."""
    parts = []
    for e in range(E):
        parts.append({"key": f"experts.{e}.w1.weight", "offset": [e, 0, 0]})
        parts.append({"key": f"experts.{e}.w3.weight", "offset": [e, I, 0]})
    return {"tensor": name, "parts": parts}


def down_assembly_stacked_on_dim_1():
    """[H, E, I]: experts stacked on dim 1 (a size-1 dim inside the box)."""
    return {"tensor": "mlp.down_t", "parts": [
        {"key": f"experts.{e}.w2.weight", "offset": [0, e, 0], "shape": [H, 1, I]}
        for e in range(E)]}


def qkv_assemblies():
    """q, k, v: row blocks of one stored fused projection (a box of a key)."""
    return [{"tensor": name, "parts": [{"key": "attn.qkv.weight", "keyOffset": [j * H, 0],
                                        "keyShape": [H, H], "offset": [0, 0]}]}
            for j, name in enumerate(("attn.q.weight", "attn.k.weight", "attn.v.weight"))]


def spec(dtype="float32", shard=None):
    tensors = [{"name": "mlp.gate_up_proj", "shape": [E, 2 * I, H], "dtype": dtype},
               {"name": "mlp.down_t", "shape": [H, E, I], "dtype": dtype},
               {"name": "attn.q.weight", "shape": [H, H], "dtype": dtype},
               {"name": "attn.k.weight", "shape": [H, H], "dtype": dtype},
               {"name": "attn.v.weight", "shape": [H, H], "dtype": dtype},
               {"name": "norm.weight", "shape": [H], "dtype": dtype}]
    if shard is not None:
        name, dim, index, count = shard
        tensors = [dict(t, shard={"split": {"dim": dim, "index": index, "count": count}})
                   for t in tensors if t["name"] == name]
    return {"tensors": tensors, "initRules": [{"pattern": "*", "init": {"constant": {"val": 7}}}]}


def expected(stored):
    w1 = torch.stack([stored[f"experts.{e}.w1.weight"] for e in range(E)])
    w3 = torch.stack([stored[f"experts.{e}.w3.weight"] for e in range(E)])
    q, k, v = torch.chunk(stored["attn.qkv.weight"], 3, dim=0)
    return {"mlp.gate_up_proj": torch.cat([w1, w3], dim=1),
            "mlp.down_t": torch.stack([stored[f"experts.{e}.w2.weight"] for e in range(E)], dim=1),
            "attn.q.weight": q, "attn.k.weight": k, "attn.v.weight": v,
            "norm.weight": stored["norm.weight"]}


def checkpoint(path="models/moe.safetensors", assemblies=None, **extra):
    if assemblies is None:
        assemblies = [gate_up_assembly(), down_assembly_stacked_on_dim_1(), *qkv_assemblies()]
    return {"path": path, "assemblies": assemblies, **extra}


def materialize(server, model_spec, source):
    return m.materialize_from_checkpoint(server, model_spec, source, CLIENT)


def test_assembled_tensors_equal_torch_stack_cat_and_chunk(server, stored):
    resp, info, got = materialize(server, spec(), checkpoint())
    for name, want in expected(stored).items():
        assert m.same_bits(got[name], want), name
    assert resp.checkpoint.tensors_loaded == 6
    assert resp.checkpoint.tensors_assembled == 5   # norm.weight is read by name
    assert resp.checkpoint.tensors_initialized == 0
    assert list(resp.checkpoint.unused_keys) == []
    init = {t.name: t.init for t in info.tensors}
    assert "assembled from 8 boxes" in init["mlp.gate_up_proj"], init
    assert "key experts.0.w1.weight" in init["mlp.gate_up_proj"]
    assert "assembled from 1 boxes" in init["attn.k.weight"]


def test_a_bfloat16_checkpoint_is_assembled_and_cast_as_torch_casts(server, stored):
    bf16 = {k: v.to(torch.bfloat16) for k, v in stored.items()}
    _, info, got = materialize(server, spec(), checkpoint("models/moe-bf16.safetensors"))
    for name, want in expected(bf16).items():
        assert got[name].dtype == torch.float32
        assert m.same_bits(got[name], want.to(torch.float32)), name
    init = {t.name: t.init for t in info.tensors}
    assert "bfloat16 cast to float32" in init["mlp.gate_up_proj"]


@pytest.mark.parametrize("name,dim", [("mlp.gate_up_proj", 0), ("mlp.gate_up_proj", 1),
                                      ("mlp.gate_up_proj", 2), ("mlp.down_t", 1),
                                      ("attn.k.weight", 1)])
def test_a_shard_of_an_assembled_tensor_is_its_slice(server, stored, name, dim):
    want = expected(stored)[name]
    for index in range(2):
        _, _, got = materialize(server, spec(shard=(name, dim, index, 2)), checkpoint(
            assemblies=[a for a in (gate_up_assembly(), down_assembly_stacked_on_dim_1(),
                                    *qkv_assemblies()) if a["tensor"] == name]))
        assert m.same_bits(got[name], torch.chunk(want, 2, dim=dim)[index]), (name, dim, index)


def test_a_shard_over_experts_reads_only_its_experts(root):
    """Shard(0) of [8, 1024, 1024] over 2 ranks, each on a server of its own
    (nothing cached before): each reads the 4 MiB tensors of its own 4
    experts and not the others'. The server reads whole 4 MiB blocks and
    the experts start after the file's header, so a rank's experts touch
    one block more than they fill."""
    expert = 1024 * 1024 * 4
    model = {"tensors": [{"name": "w", "shape": [BIG_E, 1024, 1024], "dtype": "float32",
                          "shard": {"split": {"dim": 0, "index": 0, "count": 2}}}]}
    source = {"path": "models/big.safetensors", "assemblies": [{"tensor": "w", "parts": [
        {"key": f"experts.{e}.w.weight", "offset": [e, 0, 0]} for e in range(BIG_E)]}]}
    for index in range(2):
        model["tensors"][0]["shard"]["split"]["index"] = index
        with serverproc.running_server(extra_args=(
                f"--checkpoint_roots=models={root}", "--checkpoint_cache_bytes=64MiB")) as srv:
            resp, _, got = materialize(srv, model, source)
            read = resp.checkpoint.bytes_read_from_files
            assert srv.stats().checkpoint_cache.bytes_read_from_files == read
        own = BIG_E // 2 * expert
        assert own <= read <= own + (4 << 20), (index, read)
        half = torch.arange(BIG_E // 2 * index, BIG_E // 2 * (index + 1), dtype=torch.float32)
        assert torch.equal(got["w"], half.view(-1, 1, 1).expand(-1, 1024, 1024))


def refused(server, source, model_spec=None):
    before = server.stats().checkpoint_cache.bytes_read_from_files
    with pytest.raises(grpc.RpcError) as caught:
        materialize(server, model_spec or spec(), source)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    server.assert_idle(client=CLIENT)
    assert server.stats().checkpoint_cache.bytes_read_from_files == before
    return caught.value.details()


def with_part(change):
    """The gate_up assembly with its first part changed by `change`."""
    a = gate_up_assembly()
    change(a["parts"])
    return checkpoint(assemblies=[a])


@pytest.mark.parametrize("source,words", [
    (checkpoint(assemblies=[dict(gate_up_assembly(), tensor="mlp.nope")]),
     ["checkpoint.assemblies[0].tensor", "mlp.nope"]),
    (with_part(lambda p: p[0].update(key="experts.9.w1.weight")),
     ["checkpoint.assemblies[0].parts[0].key", "experts.9.w1.weight", "not in"]),
    (with_part(lambda p: p[0].update(keyOffset=[1, 0], keyShape=[I, H])),
     ["parts[0]", "not inside checkpoint key experts.0.w1.weight", "[6, 10]"]),
    (with_part(lambda p: p[0].update(offset=[E, 0, 0])),
     ["parts[0]", "not inside tensor mlp.gate_up_proj"]),
    (with_part(lambda p: p[0].update(offset=[0, 0, 0], shape=[1, I, 2, H // 2])),
     ["parts[0]", "not inside tensor"]),
    (with_part(lambda p: p[0].update(shape=[2, 3, H])),
     ["parts[0]", "[2, 3, 10]", "[6, 10]", "differ"]),
    (with_part(lambda p: p[1].update(offset=[0, 0, 0])),
     ["parts[1]", "overlaps parts[0]", "mlp.gate_up_proj"]),
    (with_part(lambda p: p.pop()),
     ["checkpoint.assemblies[0].parts", "cover 420 of the 480 elements", "tile"]),
    (checkpoint(assemblies=[gate_up_assembly(), gate_up_assembly()]),
     ["checkpoint.assemblies[1].tensor", "assembled twice"]),
    (checkpoint(assemblies=[{"tensor": "mlp.gate_up_proj", "parts": []}]),
     ["checkpoint.assemblies[0].parts", "empty"]),
    (checkpoint(assemblies=[gate_up_assembly()],
                keyRules=[{"from": "norm.", "to": "experts.0.w1."}]),
     ["norm.weight", "experts.0.w1.weight", "assemblies also read"]),
], ids=["unknown-tensor", "unknown-key", "outside-key", "outside-tensor", "wrong-rank",
        "shapes-differ", "overlap", "gap", "twice", "no-parts", "key-also-by-rule"])
def test_a_malformed_assembly_is_refused_naming_it(server, source, words):
    text = refused(server, source)
    for word in words:
        assert word in text, (word, text)


def test_a_cast_the_policy_forbids_and_a_tied_tensor_are_refused(server):
    text = refused(server, checkpoint("models/moe-bf16.safetensors",
                                      assemblies=[gate_up_assembly()],
                                      dtypePolicy="CHECKPOINT_DTYPE_POLICY_EXACT"))
    assert "parts[0]" in text and "bfloat16" in text and "EXACT" in text
    tied = spec()
    tied["tensors"].append({"name": "mlp.tied", "shape": [E, 2 * I, H], "dtype": "float32",
                            "tieTo": "mlp.gate_up_proj"})
    text = refused(server, checkpoint(assemblies=[gate_up_assembly("mlp.tied")]), tied)
    assert "mlp.tied is tied to mlp.gate_up_proj" in text


def test_part_limits_are_enforced_before_the_checkpoint_is_opened(server):
    many = {"tensor": "mlp.gate_up_proj",
            "parts": [{"key": "experts.0.w1.weight", "offset": [0, 0, 0]}] * 4097}
    text = refused(server, checkpoint(assemblies=[many]))
    assert "checkpoint.assemblies[0].parts: 4097 parts; the limit is 4096" in text
    # Within each tensor's limit, over the request's.
    spread = [{"tensor": f"t{i}", "parts": [{"key": "norm.weight", "offset": [0]}] * 4096}
              for i in range(33)]
    text = refused(server, checkpoint(assemblies=spread))
    assert "135168 parts in all; the limit is 131072" in text


def test_key_rule_limits(server):
    """1,024 rules (SAM 3's tracker needs 255), their prefixes 64 KiB."""
    rules = [{"from": f"r{i}.", "to": ""} for i in range(1025)]
    text = refused(server, checkpoint(assemblies=[], keyRules=rules))
    assert "checkpoint.key_rules: 1025 rules; the limit is 1024" in text
    rules = [{"from": f"{i:04d}" + "x" * 996, "to": ""} for i in range(66)]
    text = refused(server, checkpoint(assemblies=[], keyRules=rules))
    assert "66000 bytes of `from` prefixes in all; the limit is 65536" in text
    # Within both, the rules are used: 1,000 that match nothing, then one
    # that maps norm.weight onto a stored key.
    rules = [{"from": f"r{i}.", "to": ""} for i in range(1000)]
    rules.append({"from": "norm.", "to": "experts.0.w2."})
    model = {"tensors": [{"name": "norm.weight", "shape": [H, I], "dtype": "float32"}]}
    _, _, got = materialize(server, model, checkpoint(assemblies=[], keyRules=rules))
    assert m.same_bits(got["norm.weight"], stored_tensors()["experts.0.w2.weight"])


def random_tiling(rng, shape):
    """Boxes (offset, shape) tiling `shape`: cut a box along a random dim
    at a random point, a few times."""
    boxes = [([0] * len(shape), list(shape))]
    for _ in range(rng.randint(0, 7)):
        k = rng.randrange(len(boxes))
        offset, size = boxes[k]
        dims = [d for d in range(len(size)) if size[d] > 1]
        if not dims:
            continue
        d = rng.choice(dims)
        cut = rng.randint(1, size[d] - 1)
        a_size, b_size = list(size), list(size)
        a_size[d], b_size[d] = cut, size[d] - cut
        b_offset = list(offset)
        b_offset[d] += cut
        boxes[k:k + 1] = [(offset, a_size), (b_offset, b_size)]
    return boxes


def test_random_assemblies_equal_torch_for_every_shard(server, root):
    """Random tilings of a [5, 7, 6] tensor, each box stored in a tensor of
    its own, larger than the box (a key_offset into it) and with size-1
    dims added or left out, in float32 or bfloat16, loaded whole and as
    each of 2 or 3 shards along every dim: every element equals what torch
    indexing of the stored tensors gives."""
    import random
    rng = random.Random(4)
    full = [5, 7, 6]
    for case in range(12):
        stored, parts = {}, []
        expected = torch.empty(full)
        for j, (offset, size) in enumerate(random_tiling(rng, full)):
            key_shape = [s for s in size if s != 1 or rng.random() < 0.5]
            if rng.random() < 0.3:
                key_shape.insert(rng.randint(0, len(key_shape)), 1)
            pad = [rng.randint(0, 2) for _ in key_shape]
            key_offset = [rng.randint(0, p) for p in pad]
            dtype = rng.choice([torch.float32, torch.bfloat16])
            tensor = torch.randn([s + p for s, p in zip(key_shape, pad)]).to(dtype)
            stored[f"case{case}.part{j}"] = tensor
            box = tensor[tuple(slice(o, o + s) for o, s in zip(key_offset, key_shape))]
            expected[tuple(slice(o, o + s) for o, s in zip(offset, size))] = \
                box.to(torch.float32).reshape(size)
            parts.append({"key": f"case{case}.part{j}", "keyOffset": key_offset,
                          "keyShape": key_shape, "offset": offset, "shape": size})
        save_file(stored, str(root / f"random{case}.safetensors"))
        source = {"path": f"models/random{case}.safetensors",
                  "assemblies": [{"tensor": "t", "parts": parts}]}
        model = {"tensors": [{"name": "t", "shape": full, "dtype": "float32"}]}
        _, _, got = materialize(server, model, source)
        assert m.same_bits(got["t"], expected), case
        dim, count = rng.randrange(3), rng.choice([2, 3])
        for index in range(count):
            model["tensors"][0]["shard"] = {"split": {"dim": dim, "index": index,
                                                      "count": count}}
            _, _, got = materialize(server, model, source)
            want = torch.chunk(expected, count, dim=dim)[index]   # DTensor's split
            assert m.same_bits(got["t"], want), (case, dim, index)
