"""Weight delivery (docs/delivery.md): every format loads in Python with the
values and digests Describe reports, for every dtype; filters, ties, bad
input; release and cancel while a fetch streams."""

import io
import json
import os
import sys
import threading
import time
import zipfile

import grpc
import pytest
import safetensors.torch
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "python"))
from materializer import digest  # noqa: E402

CLIENT = "delivery-test"
SAFETENSORS, TORCH, RAW = 1, 2, 3

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16",
          "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2",
          "complex64"]


def every_dtype_model():
    """One tensor per dtype (odd sizes, a scalar, an empty one), a tied
    pair and a non-persistent buffer."""
    tensors = []
    for i, dt in enumerate(DTYPES):
        tensors.append({"name": f"t.{dt}", "shape": [3 + i, 5], "dtype": dt})
    tensors += [
        {"name": "s.scalar", "shape": [], "dtype": "float32"},
        {"name": "s.empty", "shape": [0, 4], "dtype": "bfloat16"},
        {"name": "emb.weight", "shape": [7, 4], "dtype": "float32"},
        {"name": "head.weight", "shape": [7, 4], "dtype": "float32",
         "tieTo": "emb.weight"},
        {"name": "rope.inv_freq", "shape": [4], "dtype": "float32",
         "kind": "TENSOR_KIND_BUFFER", "persistent": False},
    ]
    rules = [
        {"pattern": "t.bool", "init": {"ones": {}}},
        {"pattern": "t.complex64", "init": {"constant": {"val": -1.5}}},
        {"pattern": "t.int*", "init": {"arange": {"start": -7}}},
        {"pattern": "t.uint8", "init": {"arange": {}}},
        {"pattern": "rope.*", "init": {"ropeInvFreq": {}}},
        {"pattern": "*", "init": {"normal": {"std": 0.5}}},
    ]
    return {"model": {"tensors": tensors, "initRules": rules, "seed": "5"}}


@pytest.fixture(scope="module")
def handle(server):
    req = server.parse_request(json.dumps(every_dtype_model()))
    resp = server.materialize(req, client=CLIENT)
    yield resp.handle
    server.release(resp.handle, client=CLIENT)


def chunks_of(server, handle, **kw):
    return server.fetch_chunks(handle, client=CLIENT, **kw)


def blob_of(chunks):
    return b"".join(c.data for c in chunks)


def describe_file(server, handle, **kw):
    return server.stub.DescribeFile(
        server.pb.FetchRequest(handle=handle, **kw),
        metadata=server.md(CLIENT), timeout=60)


def test_describe_reports_digests_of_every_tensor(server, handle):
    info = server.describe(handle, client=CLIENT)
    assert len(info.tensors) == len(DTYPES) + 5
    for t in info.tensors:
        assert t.digest.startswith("xxh3-128:") and len(t.digest) == 41, t
    by_name = {t.name: t for t in info.tensors}
    assert by_name["head.weight"].digest == by_name["emb.weight"].digest
    assert by_name["s.empty"].digest == digest.of_bytes(b"")
    assert info.digest == digest.of_handle([t.digest for t in info.tensors])
    assert info.exports == 0


@pytest.mark.parametrize("fmt", [SAFETENSORS, TORCH, RAW])
def test_file_digest_is_the_digest_of_the_bytes(server, handle, fmt):
    chunks = chunks_of(server, handle, format=fmt, chunk_bytes=4096)
    blob = blob_of(chunks)
    assert [c.digest for c in chunks[:-1]] == [""] * (len(chunks) - 1)
    assert chunks[-1].digest == digest.of_bytes(blob)
    layout = describe_file(server, handle, format=fmt)
    assert layout.total_bytes == len(blob)
    assert layout.digest == chunks[-1].digest
    assert layout.format == fmt
    # The same file again, byte for byte (deterministic), with the digest
    # now from the cache.
    again = chunks_of(server, handle, format=fmt)
    assert blob_of(again) == blob and again[-1].digest == chunks[-1].digest


def test_safetensors_loads_with_describes_digests(server, handle):
    info = server.describe(handle, client=CLIENT)
    blob = blob_of(chunks_of(server, handle))
    loaded = safetensors.torch.load(blob)
    persistent = [t for t in info.tensors if t.persistent]
    assert set(loaded) == {t.name for t in persistent}
    for t in persistent:
        assert str(loaded[t.name].dtype) == "torch." + t.dtype, t.name
        assert list(loaded[t.name].shape) == list(t.shape), t.name
        assert digest.of_tensor(loaded[t.name]) == t.digest, t.name


def test_torch_format_loads_with_weights_only_and_describes_digests(
        server, handle):
    info = server.describe(handle, client=CLIENT)
    blob = blob_of(chunks_of(server, handle, format=TORCH,
                             include_non_persistent=True))
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        assert archive.testzip() is None  # every CRC-32 is right
        names = archive.namelist()
        assert names[0] == "archive/data.pkl" and names[-1] == "archive/version"
        for entry in archive.infolist():
            assert entry.compress_type == zipfile.ZIP_STORED
            assert entry.date_time == (1980, 1, 1, 0, 0, 0)
    state = torch.load(io.BytesIO(blob), weights_only=True)
    assert list(state) == [t.name for t in info.tensors]  # state_dict order
    for t in info.tensors:
        got = state[t.name]
        assert str(got.dtype) == "torch." + t.dtype, t.name
        assert list(got.shape) == list(t.shape), t.name
        assert digest.of_tensor(got) == t.digest, t.name
    # Tied tensors share one storage, as torch.save writes them.
    assert (state["head.weight"].untyped_storage().data_ptr()
            == state["emb.weight"].untyped_storage().data_ptr())
    # DescribeFile's ranges point at each tensor's bytes in the file.
    layout = describe_file(server, handle, format=TORCH,
                           include_non_persistent=True)
    for e in layout.entries:
        assert e.offset % 64 == 0, e.name
        assert digest.of_bytes(blob[e.offset:e.offset + e.nbytes]) == e.digest


def test_torch_format_equals_what_torch_save_loads(server, handle, tmp_path):
    """The same values as torch.save + torch.load of the loaded dict."""
    blob = blob_of(chunks_of(server, handle, format=TORCH))
    state = torch.load(io.BytesIO(blob), weights_only=True)
    path = tmp_path / "resaved.pt"
    torch.save(state, path)
    again = torch.load(path, weights_only=True)
    for name, t in state.items():
        assert digest.of_tensor(again[name]) == digest.of_tensor(t), name


def test_torch_format_crcs_of_tensors_checked_in_pieces(server):
    """A tensor the server checks in several pieces (64 MiB each, combined)
    and one of an odd length after it: every zip CRC-32 right, values as
    the safetensors file has them."""
    req = server.parse_request(json.dumps({"model": {"tensors": [
        {"name": "big", "shape": [(150 << 20) // 4 + 3], "dtype": "float32"},
        {"name": "odd", "shape": [1001], "dtype": "int16"}],
        "initRules": [{"pattern": "big", "init": {"normal": {}}},
                      {"pattern": "odd", "init": {"arange": {}}}],
        "seed": "3"}}))
    h = server.materialize(req, client=CLIENT).handle
    try:
        blob = blob_of(chunks_of(server, h, format=TORCH))
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            assert archive.testzip() is None  # every CRC-32 is right
        state = torch.load(io.BytesIO(blob), weights_only=True)
        reference = safetensors.torch.load(
            blob_of(chunks_of(server, h, format=SAFETENSORS)))
        assert torch.equal(state["big"], reference["big"])
        assert torch.equal(state["odd"], reference["odd"])
    finally:
        server.release(h, client=CLIENT)


def test_raw_format_is_the_bytes_at_describe_files_offsets(server, handle):
    info = server.describe(handle, client=CLIENT)
    blob = blob_of(chunks_of(server, handle, format=RAW))
    layout = describe_file(server, handle, format=RAW)
    persistent = [t for t in info.tensors if t.persistent]
    assert [e.name for e in layout.entries] == [t.name for t in persistent]
    end = 0
    for e, t in zip(layout.entries, persistent):
        assert e.offset % 64 == 0 and e.offset >= end
        assert blob[end:e.offset] == bytes(e.offset - end)
        assert digest.of_bytes(blob[e.offset:e.offset + e.nbytes]) == t.digest
        end = e.offset + e.nbytes
    assert end == len(blob)


def test_filters_select_tensors(server, handle):
    layout = describe_file(server, handle, include=["t.*", "emb.*"],
                           exclude=["t.int*", "t.uint8"])
    names = sorted(e.name for e in layout.entries)
    assert names == sorted(
        [f"t.{d}" for d in DTYPES if not d.startswith(("int", "uint"))]
        + ["emb.weight"])
    loaded = safetensors.torch.load(blob_of(chunks_of(
        server, handle, include=["t.*", "emb.*"],
        exclude=["t.int*", "t.uint8"])))
    assert sorted(loaded) == names


def test_write_ties_once_records_the_tie(server, handle):
    blob = blob_of(chunks_of(server, handle, write_ties_once=True))
    from safetensors import safe_open
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(blob)
        f.flush()
        with safe_open(f.name, "pt") as st:
            assert "head.weight" not in st.keys()
            assert st.metadata()["tie:head.weight"] == "emb.weight"


@pytest.mark.parametrize("kw,code,text", [
    ({"include": ["nothing.*"]}, grpc.StatusCode.INVALID_ARGUMENT,
     'include[0] ("nothing.*") matches no tensor'),
    ({"exclude": ["t.*", "typo.*"]}, grpc.StatusCode.INVALID_ARGUMENT,
     'exclude[1] ("typo.*") matches no tensor'),
    ({"include": ["rope.*"]}, grpc.StatusCode.INVALID_ARGUMENT,
     "matches only non-persistent buffers"),
    ({"exclude": ["*"]}, grpc.StatusCode.INVALID_ARGUMENT,
     "leave no tensor"),
    ({"include": ["[a"]}, grpc.StatusCode.INVALID_ARGUMENT, "include[0]"),
    ({"offset": 10**12}, grpc.StatusCode.OUT_OF_RANGE, "past the end"),
    ({"format": 42}, grpc.StatusCode.INVALID_ARGUMENT, "unknown format 42"),
])
def test_bad_fetches(server, handle, kw, code, text):
    for call in (lambda: chunks_of(server, handle, **kw),
                 lambda: describe_file(server, handle, **kw)):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == code, e.value.details()
        assert text in e.value.details(), e.value.details()


def test_unknown_and_foreign_handles_are_not_found(server, handle):
    for h, client in (("h-" + "0" * 32, CLIENT), (handle, "someone-else")):
        with pytest.raises(grpc.RpcError) as e:
            server.fetch_chunks(h, client=client)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            server.stub.DescribeFile(server.pb.FetchRequest(handle=h),
                                     metadata=server.md(client), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def big_model(mib):
    return {"model": {"tensors": [
        {"name": "w", "shape": [mib, 256, 1024], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"normal": {}}}],
        "seed": "1"}}


STREAM_CLIENT = "delivery-stream-test"  # holds nothing else


def in_use(server):
    clients = server.stats(STREAM_CLIENT).clients  # one snapshot
    return clients[0].in_use_bytes if clients else 0


def test_release_while_streaming_finishes_with_the_same_bytes(server):
    req = server.parse_request(json.dumps(big_model(64)))
    h = server.materialize(req, client=STREAM_CLIENT).handle
    whole = blob_of(server.fetch_chunks(h, client=STREAM_CLIENT))
    call = server.stub.FetchWeights(
        server.pb.FetchRequest(handle=h, chunk_bytes=1 << 20),
        metadata=server.md(STREAM_CLIENT), timeout=120)
    got = bytearray()
    it = iter(call)
    got += next(it).data
    released = server.release(h, client=STREAM_CLIENT)
    assert released.released and released.freed_bytes >= 64 << 20
    # The stream holds the arena: the memory is still counted.
    assert in_use(server) >= 64 << 20
    last = None
    for c in it:
        got += c.data
        last = c
    assert bytes(got) == whole
    assert last.digest == digest.of_bytes(whole)
    deadline = time.monotonic() + 10
    while in_use(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_use(server) == 0


def test_cancel_mid_stream_frees_a_released_handle_at_once(server):
    req = server.parse_request(json.dumps(big_model(64)))
    h = server.materialize(req, client=STREAM_CLIENT).handle
    call = server.stub.FetchWeights(
        server.pb.FetchRequest(handle=h, chunk_bytes=1 << 20),
        metadata=server.md(STREAM_CLIENT), timeout=120)
    next(iter(call))
    server.release(h, client=STREAM_CLIENT)
    assert in_use(server) >= 64 << 20
    call.cancel()
    deadline = time.monotonic() + 10
    while in_use(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_use(server) == 0, "the cancelled stream kept the arena"
