"""Per-tensor digests of the stream path (FETCH_DIGEST_TENSORS): both
receivers read them off the end of the stream, the loader hashes each
tensor's bytes as they arrive (the padding between tensors left out) and
refuses a load whose bytes or digests do not match, naming the tensor; a
server that answers with a file digest only is loaded with a warning.

The tests at the end run against a real materializerd and need one that
knows FETCH_DIGEST_TENSORS."""

import logging
import random
import types

import pytest
import torch

import materializer as mz
from materializer import digest
from materializer._proto import pb
from materializer.client.client import Chunk, parse_chunk
from materializer.client.direct import DirectFetch
from materializer.load import fetch_fields, raw_layout, stream
from test_sdk_direct import (broken_response, build, chunk_message, digests_message,
                             direct_load, fake_server, http2, receive, resuming_server)

# Two tensors with padding after each, a zero-byte tensor, and a last one
# (the raw format's 64-byte alignment).
LAYOUT = [("a", 0, 12), ("b", 64, 20), ("empty", 128, 0), ("c", 128, 70)]
TOTAL = 198


@pytest.fixture(autouse=True)
def _no_handle_logged_yet(monkeypatch):
    """Every test starts as a new process would: no handle was logged as
    not verified (the loader logs that once per handle)."""
    monkeypatch.setattr(stream, "_unverified_handle", None, raising=False)


def file_bytes(seed=0):
    rnd = random.Random(seed)
    return bytes(rnd.randrange(256) for _ in range(TOTAL))


def right_digests(blob):
    return [(n, digest.of_bytes(blob[o:o + k])) for n, o, k in LAYOUT]


def feed(verifier, blob, seed=1):
    """The file's bytes in pieces of random sizes, in order, as memoryviews."""
    rnd = random.Random(seed)
    pos = 0
    view = memoryview(blob)
    while pos < len(blob):
        n = rnd.randrange(1, 50)
        verifier.update(pos, view[pos:pos + n])
        pos += n


def _framed(msg):
    """A serialized message with gRPC's 5-byte prefix."""
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


# -- parsing ------------------------------------------------------------------

def test_parse_chunk_reads_tensor_digests():
    raw = pb.WeightChunk(offset=9, total_bytes=9, tensor_digests=[
        pb.TensorDigest(name="h.0.w", digest="xxh3-128:" + "0" * 32),
        pb.TensorDigest(name="h.1.w", digest="xxh3-128:" + "1" * 32)]).SerializeToString()
    c = parse_chunk(raw)
    assert (c.offset, len(c.data), c.total_bytes, c.digest) == (9, 0, 9, "")
    assert c.tensor_digests == [("h.0.w", "xxh3-128:" + "0" * 32),
                                ("h.1.w", "xxh3-128:" + "1" * 32)]
    data = parse_chunk(pb.WeightChunk(offset=0, data=b"abc", total_bytes=9).SerializeToString())
    assert bytes(data.data) == b"abc" and data.tensor_digests == []
    # Built by hand, the old way: no digests.
    assert Chunk(0, b"", 0, "").tensor_digests == ()
    # An entry whose name runs past the entry.
    with pytest.raises(ValueError, match="TensorDigest"):
        parse_chunk(b"\x2a\x04\x0a\x05ab")


def test_parse_chunk_refuses_truncated_and_overlong_fields():
    good = pb.WeightChunk(offset=300, data=b"abcdef", total_bytes=9,
                          tensor_digests=[pb.TensorDigest(name="w", digest="d")]
                          ).SerializeToString()
    assert bytes(parse_chunk(good).data) == b"abcdef"
    # Every proper prefix that cuts a field is refused, never half-read.
    for cut in range(1, len(good)):
        try:
            c = parse_chunk(good[:cut])
        except ValueError as e:
            assert "ended inside a field" in str(e), (cut, e)
        else:   # a prefix that ends between fields is a shorter chunk
            assert len(c.data) in (0, 6), cut
    with pytest.raises(ValueError, match="varint longer than 10 bytes"):
        parse_chunk(b"\x08" + b"\xff" * 10 + b"\x01")
    with pytest.raises(ValueError, match="WeightChunk: wire type 7"):
        parse_chunk(b"\x0f")


def test_direct_receiver_reads_digest_entries_split_across_frames():
    pairs = [(f"layers.{i}.weight", digest.of_bytes(bytes([i]))) for i in range(40)]
    m = chunk_message(0, bytes(range(200)), 200) + digests_message(200, pairs)
    # Frames of 7 bytes: cuts fall inside keys, lengths, names and digests.
    addr = fake_server(lambda: http2(*[m[i:i + 7] for i in range(0, len(m), 7)]))
    got = receive(addr, bytearray(200))
    assert got == [(0, 200, 200, "", []), (200, 0, 200, "", pairs)]


def test_direct_receiver_reads_digests_over_two_full_chunks():
    # More than 64 KiB of entries: the server sends them in several chunks,
    # each near the limit, split into frames anywhere.
    pairs = [(f"model.layers.{i}.mlp.down_proj.weight", digest.of_bytes(str(i).encode()))
             for i in range(1540)]
    first, second = digests_message(0, pairs[:770]), digests_message(0, pairs[770:])
    assert 60 << 10 < len(first) <= (64 << 10) + 5
    m = first + second
    addr = fake_server(lambda: http2(m[:1000], m[1000:70000], m[70000:]))
    assert receive(addr, bytearray(0)) == [(0, 0, 0, "", pairs[:770]),
                                           (0, 0, 0, "", pairs[770:])]


def test_fields_before_the_data_take_none_of_its_bytes():
    # Fields in any order are valid protobuf: a peer may send the digests
    # first. The data after them still lands whole in the destination.
    pairs = [("w", digest.of_bytes(b"w" * 100))]
    msg = (pb.WeightChunk(digest="xxh3-128:" + "f" * 32).SerializeToString()
           + pb.WeightChunk(tensor_digests=[pb.TensorDigest(name=n, digest=d)
                                            for n, d in pairs]).SerializeToString()
           + pb.WeightChunk(offset=0, data=b"w" * 100, total_bytes=100).SerializeToString())
    addr = fake_server(lambda: http2(_framed(msg)))
    dest = bytearray(100)
    assert receive(addr, dest) == [(0, 100, 100, "xxh3-128:" + "f" * 32, pairs)]
    assert bytes(dest) == b"w" * 100


# -- the verifier -------------------------------------------------------------

def test_right_bytes_and_digests_pass():
    blob = file_bytes()
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, blob)
    v.add(right_digests(blob))
    v.check()


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 63, 64, 65, TOTAL])
def test_every_cut_of_the_file_gives_the_same_digests_and_bytes(piece):
    # Pieces of one byte up to the whole file: every tensor edge falls at
    # the start, the end and the middle of some piece.
    blob = file_bytes()
    v = stream._Verifier("h-test", LAYOUT)
    dests = {n: torch.full((k,), 0xEE, dtype=torch.uint8) for n, _, k in LAYOUT}
    sink = stream._Sink(LAYOUT, dests, "cpu", 0)
    view = memoryview(blob)
    for pos in range(0, TOTAL, piece):
        v.update(pos, view[pos:pos + piece])
        sink.write(pos, view[pos:pos + piece])
    v.add(right_digests(blob))
    v.check()
    for n, o, k in LAYOUT:
        assert bytes(dests[n].numpy()) == blob[o:o + k], n


def test_an_older_server_is_logged_once_per_handle_not_per_stream(caplog):
    # A load over three parallel streams checks three verifiers, one after
    # another; a trainer reading the log wants one line for the handle.
    with caplog.at_level(logging.WARNING, logger="materializer"):
        for handle in ("h-1", "h-1", "h-1", "h-2"):
            stream._Verifier(handle, LAYOUT).check(file_digest=digest.of_bytes(b"x"))
    lines = [r.getMessage() for r in caplog.records if "not verified" in r.getMessage()]
    assert len(lines) == 2
    assert "h-1" in lines[0] and "h-2" in lines[1]


def test_a_tensor_whose_bytes_differ_is_named_with_both_digests():
    blob = file_bytes()
    bad = bytearray(blob)
    bad[64 + 7] ^= 1           # inside b
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, bytes(bad))
    v.add(right_digests(blob))
    mine = digest.of_bytes(bytes(bad[64:84]))
    theirs = digest.of_bytes(blob[64:84])
    with pytest.raises(mz.LoadError, match="tensor 'b'") as e:
        v.check()
    assert mine in str(e.value) and theirs in str(e.value)


def test_padding_bytes_are_not_hashed():
    blob = file_bytes()
    other = bytearray(blob)
    other[12:64] = b"\xff" * 52          # the padding after a
    other[84:128] = b"\xee" * 44         # and after b
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, bytes(other), seed=2)
    v.add(right_digests(blob))
    v.check()


def test_a_zero_byte_tensor_is_checked_too():
    blob = file_bytes()
    pairs = dict(right_digests(blob))
    pairs["empty"] = digest.of_bytes(b"x")
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, blob)
    v.add(pairs.items())
    with pytest.raises(mz.LoadError, match="tensor 'empty'"):
        v.check()


def test_a_tensor_without_a_digest_is_named():
    blob = file_bytes()
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, blob)
    v.add([p for p in right_digests(blob) if p[0] != "c"])
    with pytest.raises(mz.LoadError, match="no digest for tensor 'c'"):
        v.check()


def test_a_digest_for_a_name_not_loaded_is_named():
    blob = file_bytes()
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, blob)
    v.add(right_digests(blob) + [("stranger", digest.of_bytes(b""))])
    with pytest.raises(mz.LoadError, match="'stranger'"):
        v.check()


def test_digests_sent_again_after_a_resume_are_fine_unless_they_change():
    blob = file_bytes()
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, blob)
    v.add(right_digests(blob)[:2])
    v.add(right_digests(blob))         # the resumed stream sends all of them
    v.check()
    with pytest.raises(mz.LoadError, match="two digests for tensor 'a'"):
        v.add([("a", digest.of_bytes(b"other"))])


def test_an_older_servers_file_digest_only_passes_with_a_warning(caplog):
    v = stream._Verifier("h-test", LAYOUT)
    feed(v, file_bytes())
    with caplog.at_level(logging.WARNING, logger="materializer"):
        v.check(file_digest=digest.of_bytes(b"whatever"))
    assert "not verified" in caplog.text and "h-test" in caplog.text
    # No digest of either kind: nothing vouches for the bytes.
    with pytest.raises(mz.LoadError, match="no digest for tensor 'a'"):
        stream._Verifier("h-test", LAYOUT).check()


def test_fetch_fields_ask_for_tensor_digests_only_when_verifying():
    spec = types.SimpleNamespace(tensors=[types.SimpleNamespace(name="w", tie_to="")])
    assert fetch_fields(spec)["digest"] == pb.FETCH_DIGEST_TENSORS
    assert fetch_fields(spec, ["w"])["digest"] == pb.FETCH_DIGEST_TENSORS
    assert "digest" not in fetch_fields(spec, tensor_digests=False)


# -- loads from a fake server -------------------------------------------------

class FakeStream:
    """What Client.fetch returns, for _StreamLoad: the chunks of `messages`
    (serialized WeightChunks)."""

    def __init__(self, messages):
        self.messages = messages

    def __iter__(self):
        return (parse_chunk(m) for m in self.messages)

    def cancel(self):
        pass


class FakeClient:
    """A client whose fetches get `messages`: through the direct receiver
    from a fake HTTP/2 peer, or (direct=False) as grpcio would hand them
    over (FakeStream). Records the request fields of each fetch."""

    retries = 0

    def __init__(self, messages, direct):
        self.messages = messages
        self.direct = direct
        self.fields = []

    def direct_fetch(self, handle, *, offset=0, **fields):
        self.fields.append(fields)
        if not self.direct:
            return None
        framed = b"".join(_framed(m) for m in self.messages)
        return DirectFetch(fake_server(lambda: http2(framed)), b"", idle_timeout=10)

    def fetch(self, handle, **fields):
        self.fields.append(fields)
        return FakeStream(self.messages)


def messages_of(blob, pairs, file_digest=""):
    """A stream of `blob`: data chunks of 70 bytes, then one chunk of
    (name, digest) pairs if any; the last chunk carries `file_digest`."""
    out = [pb.WeightChunk(offset=o, data=blob[o:o + 70], total_bytes=len(blob))
           for o in range(0, len(blob), 70)]
    if pairs:
        out.append(pb.WeightChunk(offset=len(blob), total_bytes=len(blob), tensor_digests=[
            pb.TensorDigest(name=n, digest=d) for n, d in pairs]))
    out[-1].digest = file_digest
    return [m.SerializeToString() for m in out]


def load_from(messages, direct):
    dests = {n: torch.zeros(k, dtype=torch.uint8) for n, _, k in LAYOUT}
    client = FakeClient(messages, direct)
    load = stream._DirectLoad(client, "h-test", LAYOUT, TOTAL, {}, dests, "cpu", None,
                              True, 0, 0)
    load.start()
    load.wait()
    assert load.transport == ("direct" if direct else "grpcio")
    return dests


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "grpcio"])
def test_a_load_with_right_digests_fills_the_tensors(direct):
    blob = file_bytes()
    dests = load_from(messages_of(blob, right_digests(blob)), direct)
    for n, o, k in LAYOUT:
        assert bytes(dests[n].numpy()) == blob[o:o + k], n


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "grpcio"])
def test_a_wrong_tensor_digest_fails_the_load_naming_the_tensor(direct):
    blob = file_bytes()
    pairs = dict(right_digests(blob))
    pairs["c"] = digest.of_bytes(b"not c")
    with pytest.raises(mz.LoadError, match="tensor 'c'.*" + pairs["c"]):
        load_from(messages_of(blob, pairs.items()), direct)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "grpcio"])
def test_an_older_servers_stream_loads_with_a_warning(direct, caplog):
    blob = file_bytes()
    with caplog.at_level(logging.WARNING, logger="materializer"):
        dests = load_from(messages_of(blob, [], file_digest=digest.of_bytes(blob)), direct)
    assert "not verified" in caplog.text
    assert bytes(dests["c"].numpy()) == blob[128:198]


def test_without_verify_digests_are_asked_for_but_not_needed():
    # Per-tensor digests either way: the server's cheaper proof (computed
    # in parallel, once per handle); only the check is skipped.
    blob = file_bytes()
    spec = types.SimpleNamespace(
        tensors=[types.SimpleNamespace(name=n, tie_to="", nbytes=k) for n, _, k in LAYOUT])
    spec.roots = spec.tensors
    assert raw_layout(spec) == (LAYOUT, TOTAL)
    for verify in (True, False):
        client = FakeClient(messages_of(blob, [] if not verify else right_digests(blob)),
                            direct=True)
        dests = {n: torch.zeros(k, dtype=torch.uint8) for n, _, k in LAYOUT}
        stream.load_stream(client, "h-test", spec, dests, verify=verify)
        assert client.fields[0].get("digest") == pb.FETCH_DIGEST_TENSORS
        assert bytes(dests["b"].numpy()) == blob[64:84]


def test_a_direct_stream_broken_among_its_digests_resumes_and_checks_them():
    """The first connection sends every byte and half the digests, then
    breaks; the second starts at the end and sends all digests again."""
    blob = file_bytes()
    pairs = right_digests(blob)
    data = b"".join(_framed(m) for m in messages_of(blob, []))
    address, offsets = resuming_server(
        lambda start: broken_response(data + digests_message(TOTAL, pairs[:2])),
        lambda start: http2(digests_message(TOTAL, pairs)))
    dests = {n: torch.zeros(k, dtype=torch.uint8) for n, _, k in LAYOUT}
    load = direct_load(address, LAYOUT, TOTAL, dests)
    assert offsets == [0, TOTAL]
    assert sorted(load.verifier.sent) == sorted(n for n, _, _ in LAYOUT)


# -- a real server (needs FETCH_DIGEST_TENSORS) -------------------------------

def test_a_tensor_digest_stream_ends_with_every_tensors_digest(server):
    model = build()
    spec = mz.describe(model, seed=7)
    layout, total = raw_layout(spec)
    with mz.Client(server.address) as c:
        handle = c.materialize(spec.to_proto()).handle
        try:
            chunks = [(ch.offset, bytes(ch.data), ch.total_bytes, ch.digest,
                       list(ch.tensor_digests))
                      for ch in c.fetch(handle, chunk_bytes=1000, **fetch_fields(spec))]
            again = [d for ch in c.fetch(handle, offset=total, **fetch_fields(spec))
                     for d in ch.tensor_digests]
            messages = []
            c.direct_fetch(handle, **fetch_fields(spec)).run(
                lambda o, n: [memoryview(bytearray(n))], lambda v: None,
                lambda *a: messages.append(a))
        finally:
            c.release(handle)
    assert all(ch[2] == total and ch[3] == "" for ch in chunks)
    data = [ch for ch in chunks if ch[1]]
    tail = [ch for ch in chunks if not ch[1]]
    assert chunks == data + tail and tail
    assert all(ch[0] == total and ch[4] for ch in tail)
    assert all(not ch[4] for ch in data)
    blob = b"".join(ch[1] for ch in data)
    assert len(blob) == total
    sent = [d for ch in tail for d in ch[4]]
    assert [n for n, _ in sent] == [n for n, _, _ in layout]
    for (name, offset, nbytes), (_, d) in zip(layout, sent):
        assert d == digest.of_bytes(blob[offset:offset + nbytes]), name
    # Resumed at the end: every digest again. The direct receiver: the same.
    assert again == sent
    assert [d for m in messages for d in m[4]] == sent
    assert all(m[3] == "" for m in messages)


@pytest.mark.parametrize("direct_fetch", [True, False], ids=["direct", "grpcio"])
def test_a_stream_load_verifies_every_tensor(server, monkeypatch, direct_fetch):
    checked = []
    check = stream._Verifier.check

    def spied(self, *a):
        check(self, *a)
        checked.append(dict(self.sent))
    monkeypatch.setattr(stream._Verifier, "check", spied)
    model = build()
    with mz.Client(server.address, direct_fetch=direct_fetch) as c:
        mz.materialize(model, client=c, transport="stream", seed=7, streams=2)
    names = {n for n, _, _ in raw_layout(mz.describe(build(), seed=7))[0]}
    assert len(checked) == 2
    assert set().union(*checked) == names
