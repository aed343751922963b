"""Resumable fetches, chunk sizes, handle isolation between clients, and
bad input (INVALID_ARGUMENT naming the tensor, nothing allocated)."""

import json

import grpc
import pytest

import matutil as m

RESUME_CLIENT = "resume-test"

# A few KiB, for the tiny chunk sizes (one message per chunk).
TINY = {
    "model": {
        "tensors": [
            {"name": "a.weight", "shape": [17, 9], "dtype": "float32"},
            {"name": "a.bias", "shape": [17], "dtype": "float32"},
            {"name": "b.weight", "shape": [5, 3, 7], "dtype": "bfloat16"},
            {"name": "c.table", "shape": [300], "dtype": "int64"},
            {"name": "d.mask", "shape": [11], "dtype": "bool"},
        ],
        "initRules": [
            {"pattern": "*.bias", "init": {"zeros": {}}},
            {"pattern": "*.weight", "init": {"normal": {"std": 0.5}}},
            {"pattern": "c.*", "init": {"constant": {"val": 7}}},
            {"pattern": "d.*", "init": {"ones": {}}},
        ],
        "seed": "99",
    },
    "label": "tiny",
}


def code_of(excinfo):
    return excinfo.value.code()


# Function-scoped (cheap: ~2 MiB), so no handle outlives its test and the
# idle checks of the other tests hold.
@pytest.fixture
def mlp(server):
    """The mlp example materialized by RESUME_CLIENT, and its whole file."""
    resp = server.materialize(server.example("mlp.json"), client=RESUME_CLIENT)
    blob = server.fetch(resp.handle, client=RESUME_CLIENT)
    yield resp.handle, blob
    server.release(resp.handle, client=RESUME_CLIENT)


@pytest.fixture
def tiny(server):
    req = server.parse_request(json.dumps(TINY))
    resp = server.materialize(req, client=RESUME_CLIENT)
    blob = server.fetch(resp.handle, client=RESUME_CLIENT)
    yield resp.handle, blob
    server.release(resp.handle, client=RESUME_CLIENT)


def fetch_prefix(server, handle, k, chunk_bytes):
    """The first k bytes of a fetch from 0, cancelling the call once they
    have arrived (an interrupted transfer)."""
    call = server.stub.FetchWeights(
        server.pb.FetchRequest(handle=handle, chunk_bytes=chunk_bytes),
        metadata=server.md(RESUME_CLIENT), timeout=120)
    got = bytearray()
    for c in call:
        assert c.offset == len(got)
        got += c.data
        if len(got) >= k:
            break
    call.cancel()
    return bytes(got[:k])


def test_fetch_is_deterministic(server, mlp):
    handle, blob = mlp
    assert server.fetch(handle, client=RESUME_CLIENT) == blob
    header, start = m.safetensors_header(blob)
    assert len(header) >= 10


def test_resume_from_any_offset(server, mlp):
    handle, blob = mlp
    total = len(blob)
    _, data_start = m.safetensors_header(blob)
    ks = sorted({0, 1, 7, 8, 9, data_start - 1, data_start, data_start + 1,
                 data_start + 4093, total // 2, total - 1, total})
    for k in ks:
        head = fetch_prefix(server, handle, k, chunk_bytes=4096)
        tail = server.fetch(handle, client=RESUME_CLIENT, offset=k,
                            chunk_bytes=65536)
        assert len(head) == k
        assert len(tail) == total - k, k
        assert head + tail == blob, f"resume at {k} differs"


def test_fetch_at_end_sends_total_and_no_data(server, tiny):
    handle, blob = tiny
    chunks = server.fetch_chunks(handle, client=RESUME_CLIENT, offset=len(blob))
    assert sum(len(c.data) for c in chunks) == 0
    assert chunks, "a fetch at the end should still say total_bytes"
    assert all(c.total_bytes == len(blob) for c in chunks)


@pytest.mark.parametrize("past", [1, 8, 1 << 40])
def test_offset_past_end_is_out_of_range(server, tiny, past):
    handle, blob = tiny
    with pytest.raises(grpc.RpcError) as e:
        server.fetch_chunks(handle, client=RESUME_CLIENT,
                            offset=len(blob) + past)
    assert code_of(e) == grpc.StatusCode.OUT_OF_RANGE, e.value.details()


@pytest.mark.parametrize("chunk_bytes", [1, 3, 8, 100, 1000])
def test_small_chunk_sizes_are_honoured(server, tiny, chunk_bytes):
    handle, blob = tiny
    chunks = server.fetch_chunks(handle, client=RESUME_CLIENT,
                                 chunk_bytes=chunk_bytes)
    assert all(len(c.data) <= chunk_bytes for c in chunks)
    assert all(len(c.data) > 0 for c in chunks)
    assert b"".join(c.data for c in chunks) == blob
    # Only the last chunk may be short.
    assert all(len(c.data) == chunk_bytes for c in chunks[:-1])


@pytest.mark.parametrize("chunk_bytes,limit", [
    (0, 4190208),            # default: the maximum
    (4096, 4096),
    (65536 + 3, 65536 + 3),
    (4190208, 4190208),      # the maximum: 4 MiB - 4 KiB
])
def test_chunk_sizes_are_honoured(server, mlp, chunk_bytes, limit):
    handle, blob = mlp
    chunks = server.fetch_chunks(handle, client=RESUME_CLIENT,
                                 chunk_bytes=chunk_bytes)
    assert max(len(c.data) for c in chunks) <= limit
    assert b"".join(c.data for c in chunks) == blob
    assert all(len(c.data) > 0 for c in chunks)


def test_chunk_bytes_over_the_maximum_is_invalid(server, tiny):
    handle, _ = tiny
    with pytest.raises(grpc.RpcError) as e:
        server.fetch_chunks(handle, client=RESUME_CLIENT,
                            chunk_bytes=4190208 + 1)
    assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()


# ---------------------------------------------------------------------------
# Isolation between clients
# ---------------------------------------------------------------------------

def test_handles_of_other_clients_do_not_exist(server):
    pb = server.pb
    req = server.parse_request(json.dumps(TINY))
    resp = server.materialize(req, client="alice")
    h = resp.handle
    try:
        assert server.describe(h, client="alice").owner == "alice"
        listed = server.stub.ListHandles(pb.ListHandlesRequest(),
                                         metadata=server.md("alice"))
        assert [x.handle for x in listed.handles] == [h]

        for other in ("bob", None, "Alice"):
            with pytest.raises(grpc.RpcError) as e:
                server.describe(h, client=other)
            assert code_of(e) == grpc.StatusCode.NOT_FOUND, (other, e.value)
            with pytest.raises(grpc.RpcError) as e:
                server.fetch_chunks(h, client=other)
            assert code_of(e) == grpc.StatusCode.NOT_FOUND, (other, e.value)
            with pytest.raises(grpc.RpcError) as e:
                server.release(h, client=other)
            assert code_of(e) == grpc.StatusCode.NOT_FOUND, (other, e.value)
            listed = server.stub.ListHandles(pb.ListHandlesRequest(),
                                             metadata=server.md(other))
            assert h not in [x.handle for x in listed.handles]
            # Other identities are never disclosed.
            st = server.stats(client=other)
            assert all(c.client != "alice" for c in st.clients)
            assert st.handles == 1  # server totals do count it

        # Still alive and intact for its owner.
        assert server.describe(h, client="alice").state == pb.HANDLE_STATE_READY
        st = server.stats(client="alice")
        mine = [c for c in st.clients if c.client == "alice"]
        assert len(mine) == 1 and mine[0].handles == 1
        assert mine[0].in_use_bytes == resp.arena_bytes
    finally:
        r = server.release(h, client="alice")
    assert r.released and r.freed_bytes == resp.arena_bytes
    # Idempotent for the owner; still invisible to others.
    r2 = server.release(h, client="alice")
    assert not r2.released and r2.freed_bytes == 0
    with pytest.raises(grpc.RpcError) as e:
        server.release(h, client="bob")
    assert code_of(e) == grpc.StatusCode.NOT_FOUND
    server.assert_idle(client="alice")


def test_unknown_handles_are_not_found(server):
    for h in ("h-" + "0" * 32, "h-" + "f" * 32):
        with pytest.raises(grpc.RpcError) as e:
            server.describe(h)
        assert code_of(e) == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            server.fetch_chunks(h)
        assert code_of(e) == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            server.release(h)
        assert code_of(e) == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

def _model(*bad, rules=None):
    """A valid 64 MiB tensor first (so a partial allocation would show in
    the stats), then the bad ones."""
    tensors = [{"name": "ok.big", "shape": [4096, 4096], "dtype": "float32"}]
    tensors += list(bad)
    return {"model": {"tensors": tensors,
                      "initRules": rules if rules is not None else
                      [{"pattern": "ok.*", "init": {"normal": {"std": 1}}},
                       {"pattern": "bad.*", "init": {"zeros": {}}}],
                      "seed": "3"},
            "label": "bad"}


# (id, request json, names the message must contain)
BAD = [
    ("negative-dimension",
     _model({"name": "bad.neg", "shape": [4, -4], "dtype": "float32"}),
     ["bad.neg"]),
    ("unknown-dtype",
     _model({"name": "bad.dtype", "shape": [4], "dtype": "float33"}),
     ["bad.dtype"]),
    ("duplicate-name",
     _model({"name": "bad.dup", "shape": [4], "dtype": "float32"},
            {"name": "bad.dup", "shape": [8], "dtype": "float32"}),
     ["bad.dup"]),
    ("negative-std",
     _model({"name": "bad.std", "shape": [4], "dtype": "float32",
             "init": {"normal": {"mean": 0, "std": -0.5}}}),
     ["bad.std"]),
    ("uniform-b-below-a",
     _model({"name": "bad.uniform", "shape": [4], "dtype": "float32",
             "init": {"uniform": {"a": 1, "b": -1}}}),
     ["bad.uniform"]),
    ("nan-mean",
     _model({"name": "bad.nan", "shape": [4], "dtype": "float32",
             "init": {"normal": {"mean": "NaN", "std": 1}}}),
     ["bad.nan"]),
    ("too-many-dimensions",
     _model({"name": "bad.rank", "shape": [1] * 17, "dtype": "float32"}),
     ["bad.rank"]),
    ("space-in-name",
     _model({"name": "bad name", "shape": [4], "dtype": "float32"}),
     ["bad name"]),
    ("uncovered",
     _model({"name": "lonely.a", "shape": [4], "dtype": "float32"},
            {"name": "lonely.b", "shape": [2, 2], "dtype": "bfloat16"}),
     ["lonely.a", "lonely.b"]),
    ("too-big",
     _model({"name": "bad.huge", "shape": [1 << 40, 1 << 30],
             "dtype": "float32"}),
     ["bad.huge"]),
]


@pytest.mark.parametrize("case,req_json,names", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_invalid_argument(server, case, req_json, names):
    pb = server.pb
    text = json.dumps(req_json)
    for rpc, cls in ((server.stub.Plan, pb.PlanRequest),
                     (server.stub.Materialize, pb.MaterializeRequest)):
        msg = server.parse_request(text, cls) if cls is pb.MaterializeRequest \
            else server.json_format.Parse(
                json.dumps({k: v for k, v in req_json.items()
                            if k in ("model", "placement")}), cls())
        with pytest.raises(grpc.RpcError) as e:
            rpc(msg, metadata=server.md("bad-input"), timeout=60)
        assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT, (
            case, rpc, e.value.code(), e.value.details())
        for n in names:
            assert n in e.value.details(), (case, e.value.details())
    server.assert_idle(client="bad-input")


def test_negative_std_in_a_rule_is_invalid(server):
    req = _model({"name": "bad.r", "shape": [4], "dtype": "float32"},
                 rules=[{"pattern": "*", "init": {"normal": {"std": -1}}}])
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)))
    assert code_of(e) == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    server.assert_idle()


def test_over_capacity_is_resource_exhausted_and_allocates_nothing(server):
    # 9 GiB against the suite's 8 GiB pool: fits nowhere.
    req = {"model": {"tensors": [{"name": "huge", "shape": [9, 1 << 28],
                                  "dtype": "float32"}],
                     "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}}
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(server.parse_request(json.dumps(req)))
    assert code_of(e) == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    server.assert_idle()


def test_server_still_serves_after_bad_input(server):
    req = server.parse_request(json.dumps(TINY))
    with server.handle(req, client="after-errors") as resp:
        assert resp.state == server.pb.HANDLE_STATE_READY
    server.assert_idle(client="after-errors")
