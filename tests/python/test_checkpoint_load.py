"""Materialize from a checkpoint (MaterializeRequest.checkpoint;
docs/checkpoints.md), against what transformers' own save_pretrained and
from_pretrained give: every tensor of the checkpoint bit for bit (and a
bfloat16 checkpoint cast to float32 as torch casts), tensors the checkpoint
lacks from their inits, one read of the files however often they are
asked for, and bad paths, files and mappings refused with nothing held."""

import json
import os

import pytest
import torch

import grpc

import matutil as m
import scrape
import serverproc

transformers = pytest.importorskip("transformers")

CLIENT = "ckpt"


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2,
                                     vocab_size=100, n_positions=32)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt-root")
    models = base / "models"
    models.mkdir()
    model = tiny_gpt2()
    model.save_pretrained(models / "gpt2-st")
    model.save_pretrained(models / "gpt2-sharded", max_shard_size="60KB")
    # transformers 5 writes safetensors whatever safe_serialization says:
    # the torch zip format as torch.save writes it (transformers 4's
    # pytorch_model.bin).
    (models / "gpt2-bin").mkdir()
    model.config.save_pretrained(models / "gpt2-bin")
    torch.save(model.state_dict(), models / "gpt2-bin" / "pytorch_model.bin")
    model.to(torch.bfloat16).save_pretrained(models / "gpt2-bf16")
    outside = base / "outside"
    outside.mkdir()
    model.float().save_pretrained(outside / "gpt2")
    os.symlink(outside / "gpt2", models / "escape")
    return base


@pytest.fixture(scope="module")
def server(root):
    with serverproc.running_server(extra_args=(
            f"--checkpoint_roots=models={root / 'models'}",
            "--checkpoint_cache_bytes=64MiB", "--metrics_listen=127.0.0.1:0"),
            log_level="info") as srv:
        yield srv


def spec_of(model, dtype=None):
    """The model's state_dict as a request: names, shapes, dtypes, the tie
    save_pretrained drops, and a zeros rule for anything not loaded."""
    tensors = []
    for name, t in model.state_dict().items():
        entry = {"name": name, "shape": list(t.shape),
                 "dtype": dtype or str(t.dtype).replace("torch.", "")}
        if name == "lm_head.weight":
            entry["tieTo"] = "transformer.wte.weight"
        tensors.append(entry)
    return {"tensors": tensors, "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}


def rpc_error(call):
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def rpc_error_text(call):
    err = rpc_error(call)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    return err.details()


def materialize(server, model_spec, checkpoint, client=CLIENT):
    return m.materialize_from_checkpoint(server, model_spec, checkpoint, client)


@pytest.mark.parametrize("folder", ["gpt2-st", "gpt2-sharded", "gpt2-bin"])
def test_every_tensor_equals_from_pretrained(server, root, folder):
    if folder == "gpt2-bin":
        assert not (root / "models" / folder / "model.safetensors").exists()
        want = torch.load(root / "models" / folder / "pytorch_model.bin",
                          weights_only=True)
        want.pop("lm_head.weight")  # tied: the server loads wte once
    else:
        want = transformers.GPT2LMHeadModel.from_pretrained(
            root / "models" / folder).state_dict()
        want.pop("lm_head.weight")
    resp, info, got = materialize(server, spec_of(tiny_gpt2()),
                                  {"path": f"models/{folder}"})
    for name, t in want.items():
        assert m.same_bits(got[name], t), name
    loaded = sum(1 for t in info.tensors if t.init.startswith("checkpoint "))
    assert resp.checkpoint.tensors_loaded == loaded == len(want)
    # torch.save keeps the tied lm_head.weight as a key of its own.
    assert list(resp.checkpoint.unused_keys) == (
        ["lm_head.weight"] if folder == "gpt2-bin" else [])


def test_bf16_checkpoint_cast_to_float32_as_torch_casts(server, root):
    want = transformers.GPT2LMHeadModel.from_pretrained(
        root / "models" / "gpt2-bf16", torch_dtype=torch.bfloat16).state_dict()
    _, info, got = materialize(server, spec_of(tiny_gpt2(), dtype="float32"),
                               {"path": "models/gpt2-bf16"})
    for name, t in want.items():
        assert got[name].dtype == torch.float32
        assert m.same_bits(got[name], t.to(torch.float32)), name
    wte = next(t for t in info.tensors if t.name == "transformer.wte.weight")
    assert "bfloat16 cast to float32" in wte.init


def test_exact_policy_refuses_a_cast(server):
    msg = rpc_error_text(lambda: materialize(
        server, spec_of(tiny_gpt2(), dtype="float32"),
        {"path": "models/gpt2-bf16", "dtypePolicy": "CHECKPOINT_DTYPE_POLICY_EXACT"}))
    assert "transformer.wte.weight" in msg and "bfloat16" in msg and "EXACT" in msg
    server.assert_idle(client=CLIENT)


def test_missing_tensors_take_their_init_and_unused_keys_are_reported(server):
    spec = spec_of(tiny_gpt2())
    spec["tensors"] = [t for t in spec["tensors"] if t["name"] != "transformer.ln_f.bias"]
    spec["tensors"].append({"name": "score.weight", "shape": [3, 64], "dtype": "float32",
                            "init": {"normal": {"std": 0.5}}})
    resp, info, got = materialize(server, spec, {"path": "models/gpt2-st"})
    assert resp.checkpoint.unused_keys == ["transformer.ln_f.bias"]
    assert resp.checkpoint.tensors_initialized == 1
    assert got["score.weight"].std().item() > 0.3  # drawn, not zeros or garbage
    score = next(t for t in info.tensors if t.name == "score.weight")
    assert score.init.startswith("normal")
    # require_all names what is missing, and holds nothing.
    msg = rpc_error_text(lambda: materialize(
        server, spec, {"path": "models/gpt2-st", "requireAll": True}))
    assert "score.weight" in msg and "require_all" in msg
    server.assert_idle(client=CLIENT)


def test_key_rules_map_names_to_keys(server, root):
    """A base GPT2Model's names (no "transformer." prefix) mapped onto an
    LM checkpoint's keys."""
    base = transformers.GPT2Model(tiny_gpt2().config)
    spec = spec_of(base)
    resp, _, got = materialize(server, spec, {
        "path": "models/gpt2-st",
        "keyRules": [{"from": "", "to": "transformer."}]})
    full = transformers.GPT2LMHeadModel.from_pretrained(
        root / "models" / "gpt2-st").state_dict()
    for name in base.state_dict():
        assert m.same_bits(got[name], full["transformer." + name]), name
    assert resp.checkpoint.unused_keys == []  # every key has its tensor
    # Two names onto one key is refused, naming both.
    msg = rpc_error_text(lambda: materialize(server, spec, {
        "path": "models/gpt2-st",
        "keyRules": [{"from": "h.0.ln_2.", "to": "transformer.h.0.ln_1."},
                     {"from": "", "to": "transformer."}]}))
    assert "h.0.ln_1.weight" in msg and "h.0.ln_2.weight" in msg and "both map" in msg


def test_shards_read_their_box(server, root):
    """Shard(0) and Shard(1) of a 2-D weight: each rank's bytes are the
    slice of the checkpoint's tensor."""
    want = transformers.GPT2LMHeadModel.from_pretrained(
        root / "models" / "gpt2-st").state_dict()
    name = "transformer.h.0.mlp.c_fc.weight"  # [64, 256]
    for dim in (0, 1):
        for index in range(2):
            spec = {"tensors": [{"name": name, "shape": list(want[name].shape),
                                 "dtype": "float32",
                                 "shard": {"split": {"dim": dim, "index": index,
                                                     "count": 2}}}],
                    "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}
            _, _, got = materialize(server, spec, {"path": "models/gpt2-st"})
            assert m.same_bits(got[name], torch.chunk(want[name], 2, dim=dim)[index])


def test_elements_split_by_a_block_boundary_are_read_and_cast_whole(server, root):
    """safetensors does not require a tensor to start at a multiple of its
    item size: here a float32 tensor starts 6 bytes into the data, so the
    server's 4 MiB read blocks split some of its elements. Every element
    comes back whole, as stored (float32) and cast (float64), on the
    readers that share the tensor's pieces."""
    folder = root / "models" / "misaligned"
    folder.mkdir(exist_ok=True)
    a = torch.arange(3, dtype=torch.float32).to(torch.bfloat16)
    b = torch.randn(1_100_000, generator=torch.Generator().manual_seed(1))  # 4.4 MB
    a_bytes = a.view(torch.int16).numpy().tobytes()
    b_bytes = b.numpy().tobytes()
    header = json.dumps({
        "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
        "b": {"dtype": "F32", "shape": [1_100_000],
              "data_offsets": [6, 6 + len(b_bytes)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header + a_bytes + b_bytes)
    for dtype, want in (("float32", b), ("float64", b.double())):
        spec = {"tensors": [{"name": "a", "shape": [3], "dtype": "float32"},
                            {"name": "b", "shape": [1_100_000], "dtype": dtype}],
                "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}
        resp, _, got = materialize(server, spec, {"path": "models/misaligned"})
        assert resp.checkpoint.tensors_loaded == 2
        assert m.same_bits(got["a"], a.float())
        assert m.same_bits(got["b"], want), dtype


def test_a_second_load_reads_nothing_from_files(server):
    spec = spec_of(tiny_gpt2())
    first, _, _ = materialize(server, spec, {"path": "models/gpt2-sharded"})
    second, _, _ = materialize(server, spec, {"path": "models/gpt2-sharded"},
                               client="other-job")
    assert second.checkpoint.bytes_read_from_files == 0
    assert second.checkpoint.bytes_from_cache > 0
    stats = server.stats(CLIENT)
    assert stats.checkpoint_cache.capacity_bytes == 64 << 20
    assert stats.checkpoint_cache.cached_bytes > 0
    # /metrics says the same as GetStats.
    samples = scrape.scrape(scrape.metrics_url(server))
    cache = stats.checkpoint_cache
    assert samples[("materializer_checkpoint_cache_capacity_bytes", frozenset())] == 64 << 20
    assert samples[("materializer_checkpoint_cache_bytes", frozenset())] == cache.cached_bytes
    assert samples[("materializer_checkpoint_read_bytes_total", frozenset())] == \
        cache.bytes_read_from_files
    assert samples[("materializer_checkpoint_cache_served_bytes_total", frozenset())] == \
        cache.bytes_served_from_cache


def test_a_rewritten_file_is_read_again_never_served_stale(server, root):
    folder = root / "models" / "rewrite"
    model = tiny_gpt2()
    model.save_pretrained(folder)
    spec = spec_of(model)
    _, _, before = materialize(server, spec, {"path": "models/rewrite"})
    with torch.no_grad():
        model.transformer.wte.weight.add_(1.0)
    model.save_pretrained(folder)
    resp, _, after = materialize(server, spec, {"path": "models/rewrite"})
    assert resp.checkpoint.bytes_read_from_files > 0
    assert m.same_bits(after["transformer.wte.weight"],
                       model.transformer.wte.weight.detach())
    assert not torch.equal(after["transformer.wte.weight"],
                           before["transformer.wte.weight"])


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_file_rewritten_during_a_read_fails_and_never_mixes(server, root):
    """A writer rewrites a 64 MB tensor in place, 1 MiB at a time (as cp,
    rsync or save_pretrained write), the whole time the server loads it:
    every load either fails with FAILED_PRECONDITION naming the file, or
    (between two passes) returns one version whole; never bytes of both,
    and nothing is held afterwards."""
    import threading
    import safetensors.torch
    folder = root / "models" / "busy"
    folder.mkdir(exist_ok=True)
    path = folder / "model.safetensors"
    n = 16 << 20
    versions = [torch.full((n,), 1.0), torch.full((n,), 2.0)]
    safetensors.torch.save_file({"w": versions[0]}, str(path))
    data_at = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    payloads = [v.numpy().tobytes() for v in versions]
    stop = threading.Event()

    def rewrite():
        fd = os.open(path, os.O_WRONLY)
        try:
            k = 1
            while not stop.is_set():
                for at in range(0, len(payloads[k]), 1 << 20):
                    os.pwrite(fd, payloads[k][at:at + (1 << 20)], data_at + at)
                k ^= 1
        finally:
            os.close(fd)

    spec = {"tensors": [{"name": "w", "shape": [n], "dtype": "float32"}],
            "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}
    writer = threading.Thread(target=rewrite)
    writer.start()
    refused = whole = 0
    try:
        for _ in range(12):
            try:
                _, _, got = materialize(server, spec, {"path": "models/busy"})
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
                assert "models/busy/model.safetensors" in e.details(), e.details()
                server.assert_idle(client=CLIENT)
                refused += 1
                continue
            assert any(m.same_bits(got["w"], v) for v in versions), \
                "a load mixed two versions of the file"
            whole += 1
    finally:
        stop.set()
        writer.join()
    assert refused >= 1, f"the rewrite was never caught ({whole} whole loads)"


@pytest.mark.parametrize("path,code,text", [
    ("other/gpt2", "INVALID_ARGUMENT", "other"),
    ("models/../outside/gpt2", "INVALID_ARGUMENT", ".."),
    ("models/escape", "PERMISSION_DENIED", "models/escape"),
    ("models/nothing-here", "NOT_FOUND", "models/nothing-here"),
    ("/etc/passwd", "INVALID_ARGUMENT", "checkpoint.path"),
])
def test_paths_outside_the_roots_are_refused(server, path, code, text):
    err = rpc_error(lambda: materialize(server, spec_of(tiny_gpt2()), {"path": path}))
    assert err.code().name == code, err.details()
    assert text in err.details()
    server.assert_idle(client=CLIENT)


def test_bad_files_are_refused_naming_them(server, root):
    good = (root / "models" / "gpt2-st" / "model.safetensors").read_bytes()
    write(root / "models" / "bad" / "truncated.safetensors", good[: len(good) // 2])
    header_len = int.from_bytes(good[:8], "little")
    header = json.loads(good[8:8 + header_len])
    key = next(k for k in header if k != "__metadata__")
    other = next(k for k in header if k not in ("__metadata__", key))
    header[key]["data_offsets"] = header[other]["data_offsets"]  # overlap
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    write(root / "models" / "bad" / "overlap.safetensors",
          len(text).to_bytes(8, "little") + text + good[8 + header_len:])
    for name, words in [("truncated.safetensors", ["truncated.safetensors"]),
                        ("overlap.safetensors", ["overlap.safetensors"])]:
        err = rpc_error(lambda: materialize(server, spec_of(tiny_gpt2()),
                                              {"path": f"models/bad/{name}"}))
        assert err.code().name == "INVALID_ARGUMENT", err.details()
        for w in words:
            assert w in err.details()
        server.assert_idle(client=CLIENT)


def test_a_damaged_torch_archive_fails_its_crc_and_holds_nothing(server, root):
    """One bit flipped on disk inside a torch.save archive's storage: the
    zip's CRC-32 of that storage no longer holds, and Materialize fails with
    DATA_LOSS naming the file and the tensor, nothing held, instead of
    loading the damaged value. The tensor spans several 16 MiB read pieces,
    whose CRCs the server combines; before the damage it loads bit for bit.
    A tensor that is a view into a larger storage has no CRC of its own and
    is not checked."""
    folder = root / "models" / "damaged-bin"
    folder.mkdir()
    torch.manual_seed(1)
    big = torch.randn(40 << 20 >> 2)  # 40 MiB: three pieces
    shared = torch.randn(12)
    state = {"w": big, "b": torch.randn(7), "v": shared[4:8]}
    path = folder / "pytorch_model.bin"
    torch.save(state, path)
    spec = {"tensors": [
        {"name": "w", "shape": [big.numel()], "dtype": "float32"},
        {"name": "b", "shape": [7], "dtype": "float32"},
        {"name": "v", "shape": [4], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}
    ckpt = {"path": "models/damaged-bin"}
    _, _, got = materialize(server, spec, ckpt)
    for name, t in state.items():
        assert m.same_bits(got[name], t), name

    def damage(values, index):
        blob = bytearray(path.read_bytes())
        at = blob.find(values[index:index + 4].numpy().tobytes())
        assert at > 0
        blob[at] ^= 0x01
        fresh = folder / "fresh.tmp"
        fresh.write_bytes(blob)
        os.replace(fresh, path)  # a new file: the cache does not know it

    damage(big, big.numel() // 2)
    err = rpc_error(lambda: materialize(server, spec, ckpt))
    assert err.code() == grpc.StatusCode.DATA_LOSS, err.details()
    for words in ["pytorch_model.bin", '"w"', "CRC-32", "damaged"]:
        assert words in err.details(), err.details()
    server.assert_idle(client=CLIENT)

    torch.save(state, folder / "whole.tmp")  # whole again, as a new file
    os.replace(folder / "whole.tmp", path)
    # then the bytes of the view's storage damaged
    damage(shared, 5)
    _, _, got = materialize(server, spec, ckpt)
    assert not m.same_bits(got["v"], state["v"])  # unchecked: no CRC of its own
    assert m.same_bits(got["w"], big)


def test_a_shape_that_differs_is_refused_naming_both(server):
    spec = spec_of(tiny_gpt2())
    for t in spec["tensors"]:
        if t["name"] == "transformer.wpe.weight":
            t["shape"] = [16, 64]
    msg = rpc_error_text(lambda: materialize(server, spec, {"path": "models/gpt2-st"}))
    assert "transformer.wpe.weight" in msg and "[16, 64]" in msg and "[32, 64]" in msg
    server.assert_idle(client=CLIENT)


def test_a_server_without_roots_says_so():
    with serverproc.running_server() as srv:
        err = rpc_error(lambda: materialize(
            srv, spec_of(tiny_gpt2()), {"path": "models/gpt2"}))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--checkpoint_roots" in err.details()


def test_matctl_inspect_and_materialize_with_a_checkpoint(server, root, tmp_path):
    from materializer import digest
    from test_matctl_identity import matctl
    folder = root / "models" / "gpt2-sharded"
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(files) > 1
    r = matctl(f"--server={server.address}", f"--client={CLIENT}", "--output=json",
               "inspect", "models/gpt2-sharded", "--digest")
    assert r.returncode == 0, r.stderr
    contents = json.loads(r.stdout)
    assert [f["path"] for f in contents["files"]] == [f"models/gpt2-sharded/{n}" for n in files]
    for f, name in zip(contents["files"], files):
        assert f["digest"] == digest.of_bytes((folder / name).read_bytes())
        assert int(f["bytes"]) == (folder / name).stat().st_size
    want = transformers.GPT2LMHeadModel.from_pretrained(folder).state_dict()
    keys = {t["key"]: t for t in contents["tensors"]}
    assert set(keys) == set(want) - {"lm_head.weight"}
    wte = keys["transformer.wte.weight"]
    assert wte["dtype"] == "float32" and [int(x) for x in wte["shape"]] == [100, 64]
    table = matctl(f"--server={server.address}", f"--client={CLIENT}",
                   "inspect", "models/gpt2-sharded")
    assert table.returncode == 0 and "transformer.wte.weight" in table.stdout
    assert f"{len(keys)} tensors" in table.stdout
    # materialize FILE --checkpoint: the file's model, the checkpoint's bytes.
    request = tmp_path / "gpt2.json"
    request.write_text(json.dumps({"model": spec_of(tiny_gpt2())}))
    made = matctl(f"--server={server.address}", f"--client={CLIENT}", "--output=json",
                  "materialize", str(request), "--checkpoint", "models/gpt2-sharded")
    assert made.returncode == 0, made.stderr
    resp = json.loads(made.stdout)
    assert resp["checkpoint"]["tensorsLoaded"] == len(keys)
    server.release(resp["handle"], CLIENT)
    missing = matctl(f"--server={server.address}", f"--client={CLIENT}",
                     "inspect", "models/none")
    assert missing.returncode != 0 and "models/none" in missing.stderr
