"""The direct FetchWeights receiver (client/direct.py): the stream into CPU
tensors arrives straight in the tensors, over plain TCP and TLS, with the
same bytes, identity and errors as through grpcio; a peer that breaks the
protocol gets a clear error and never a write outside the destinations."""

import socket
import struct
import threading

import grpc
import hpack
import pytest
import torch
import torch.nn as nn

import certs
import materializer as mz
import serverproc
from materializer import digest
from materializer._proto import pb
from materializer.client import direct
from materializer.client.direct import DirectFetch, ProtocolError, Unsupported
from materializer.load import stream
from test_auth import pki  # noqa: F401 - the certificates fixture


@pytest.fixture(scope="module")
def srv():
    with serverproc.running_server() as s:
        yield s


class Odd(nn.Module):
    """Sizes that are not multiples of 64 bytes, so the raw layout has
    padding between tensors (the receiver fills a scratch buffer there)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(7, 3)
        self.b = nn.Embedding(1000, 129)
        self.c = nn.Linear(129, 1)
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64) * 3)


def build():
    torch.manual_seed(0)
    with mz.meta_device():
        return Odd()


@pytest.fixture
def direct_runs(monkeypatch):
    """How many DirectFetch calls ran to their end."""
    runs = []
    run = DirectFetch.run

    def counted(self, *a):
        out = run(self, *a)
        runs.append(self.address)
        return out
    monkeypatch.setattr(DirectFetch, "run", counted)
    return runs


def load(address, streams=1, **client_kw):
    model = build()
    with mz.Client(address, **client_kw) as c:
        mz.materialize(model, client=c, transport="stream", seed=7, streams=streams)
    return model.state_dict()


@pytest.mark.parametrize("streams", [1, 3])
def test_direct_and_grpcio_give_the_same_bytes(srv, direct_runs, streams):
    mine = load(srv.address, streams=streams)
    assert len(direct_runs) == streams
    theirs = load(srv.address, streams=streams, direct_fetch=False)
    assert len(direct_runs) == streams           # grpcio: no direct call
    assert mine.keys() == theirs.keys()
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), k
    assert torch.equal(mine["steps"], torch.arange(5) * 3)
    srv.assert_idle()


def test_over_mtls_the_identity_is_the_certificate(pki, direct_runs):  # noqa: F811
    with serverproc.running_server([f"--tls_cert={pki / 'server.pem'}",
                                    f"--tls_key={pki / 'server.key'}",
                                    f"--tls_client_ca={pki / 'ca.pem'}"], connect=False) as s:
        port = s.address.rsplit(":", 1)[1]
        alice = mz.TLS(root_certificates=pki / "ca.pem", certificate_chain=pki / "alice.pem",
                       private_key=pki / "alice.key")
        model = build()
        with mz.Client(f"127.0.0.1:{port}", tls=alice) as c:
            r = mz.materialize(model, client=c, transport="stream", seed=7, keep_handle=True)
            assert len(direct_runs) == 1
            # Bob's certificate, the same handle: not his.
            cert, key = certs.Pki(pki).client("bob")
            bob = mz.TLS(root_certificates=pki / "ca.pem", certificate_chain=cert,
                         private_key=key)
            with mz.Client(f"127.0.0.1:{port}", tls=bob, session=False) as other:
                fetch = other.direct_fetch(r.handle, format=pb.WEIGHT_FORMAT_RAW)
                written = []
                with pytest.raises(mz.RpcError) as e:
                    fetch.run(lambda o, n: written.append(n) or [memoryview(bytearray(n))],
                              lambda v: None, lambda *a: None)
                assert e.value.code == grpc.StatusCode.NOT_FOUND
                assert written == []
            c.release(r.handle)
        assert torch.equal(model.state_dict()["steps"], torch.arange(5) * 3)


def test_a_token_over_tls(pki, tmp_path, direct_runs):  # noqa: F811
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-0123456789abcdef trainer-a\n")
    with serverproc.running_server([f"--tls_cert={pki / 'server.pem'}",
                                    f"--tls_key={pki / 'server.key'}",
                                    f"--token_file={tokens}"], connect=False) as s:
        port = s.address.rsplit(":", 1)[1]
        tls = mz.TLS(root_certificates=pki / "ca.pem")
        mine = load(f"localhost:{port}", tls=tls, token="tok-0123456789abcdef")
        assert len(direct_runs) == 1
        for k, v in load(f"localhost:{port}", tls=tls, token="tok-0123456789abcdef",
                         direct_fetch=False).items():
            assert torch.equal(mine[k], v), k
        # A wrong token: the server's UNAUTHENTICATED, as through grpcio.
        with mz.Client(f"localhost:{port}", tls=tls, token="tok-not-a-token-at-all",
                       session=False) as c:
            with pytest.raises(mz.RpcError) as e:
                c.direct_fetch("h-" + "0" * 32).run(lambda o, n: [], lambda v: None,
                                                    lambda *a: None)
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_when_the_direct_connection_cannot_be_used_grpcio_loads(srv, monkeypatch, direct_runs):
    def refuse(self):
        raise Unsupported("no HTTP/2 here (test)")
    monkeypatch.setattr(DirectFetch, "_connect", refuse)
    mine = load(srv.address)
    assert direct_runs == []
    for k, v in load(srv.address, direct_fetch=False).items():
        assert torch.equal(mine[k], v), k
    srv.assert_idle()


# -- a peer that misbehaves ---------------------------------------------------

def fake_server(script):
    """A TCP server that reads the client's request and sends `script`'s
    bytes (a function of nothing), then closes. Returns its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            try:
                conn.recv(1 << 16)
                conn.sendall(script())
                conn.recv(1 << 16)
            except OSError:
                pass
        listener.close()
    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def frame(kind, flags, stream_id, payload):
    return direct._frame(kind, flags, stream_id, payload)


def chunk_message(offset, data, total):
    msg = pb.WeightChunk(offset=offset, data=data, total_bytes=total).SerializeToString()
    return struct.pack(">BI", 0, len(msg)) + msg


def digests_message(total, pairs):
    """A chunk without data that carries (name, digest) pairs, as a stream
    with FETCH_DIGEST_TENSORS ends."""
    msg = pb.WeightChunk(offset=total, total_bytes=total, tensor_digests=[
        pb.TensorDigest(name=n, digest=d) for n, d in pairs]).SerializeToString()
    return struct.pack(">BI", 0, len(msg)) + msg


def http2(*data_payloads, trailers=(("grpc-status", "0"),)):
    enc = hpack.Encoder()
    out = frame(direct.SETTINGS, 0, 0, b"")
    out += frame(direct.HEADERS, direct.END_HEADERS, 1,
                 enc.encode([(":status", "200"), ("content-type", "application/grpc")]))
    for p in data_payloads:
        out += frame(direct.DATA, 0, 1, p)
    out += frame(direct.HEADERS, direct.END_HEADERS | direct.END_STREAM, 1, enc.encode(trailers))
    return out


def receive(address, dest):
    """DirectFetch into `dest` (a bytearray), placing like the loader does:
    only in order and inside dest."""
    state = {"next": 0}

    def place(offset, n):
        if offset != state["next"] or offset + n > len(dest):
            raise mz.LoadError(f"chunk at {offset}+{n}, expected {state['next']} "
                               f"within {len(dest)}")
        return [memoryview(dest)[offset:offset + n]]

    def piece(views):
        state["next"] += sum(len(v) for v in views)
    messages = []
    DirectFetch(address, b"", idle_timeout=10).run(place, piece,
                                                   lambda *a: messages.append(a))
    return messages


def test_a_well_formed_fake_stream_is_received_across_frame_boundaries():
    # One message split over three DATA frames, cut inside the prefix and
    # inside the data.
    m = chunk_message(0, bytes(range(200)), 200)
    addr = fake_server(lambda: http2(m[:3], m[3:50], m[50:]))
    dest = bytearray(200)
    assert receive(addr, dest) == [(0, 200, 200, "", [])]
    assert bytes(dest) == bytes(range(200))


def test_a_chunk_outside_the_destination_is_refused_before_any_write():
    addr = fake_server(lambda: http2(chunk_message(1 << 40, b"x" * 64, 1 << 41)))
    dest = bytearray(64)
    with pytest.raises(mz.LoadError, match="expected 0"):
        receive(addr, dest)
    assert bytes(dest) == bytes(64)


@pytest.mark.parametrize("payload,match", [
    (struct.pack(">BI", 1, 3) + b"abc", "compressed"),
    (struct.pack(">BI", 0, 4) + b"\x12\x7f\x00\x00", "longer than its message"),
    (struct.pack(">BI", 0, 2) + b"\x0f\x00", "wire type"),
    # A tensor digest entry whose name runs past the entry.
    (struct.pack(">BI", 0, 6) + b"\x2a\x04\x0a\x05ab", "TensorDigest ended inside"),
])
def test_broken_grpc_framing_is_a_protocol_error(payload, match):
    addr = fake_server(lambda: http2(payload))
    with pytest.raises(Unsupported, match=match):
        receive(addr, bytearray(128))


def test_a_peer_that_is_not_http2_is_unsupported_not_a_hang():
    addr = fake_server(lambda: b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 100)
    with pytest.raises(Unsupported):
        receive(addr, bytearray(16))


def test_an_error_status_in_the_trailers_is_the_rpc_error():
    addr = fake_server(lambda: http2(trailers=(("grpc-status", "7"),
                                               ("grpc-message", "not yours%21"))))
    with pytest.raises(mz.RpcError) as e:
        receive(addr, bytearray(16))
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert e.value.message == "not yours!"


def test_the_stream_breaking_after_data_is_unavailable():
    m = chunk_message(0, b"y" * 100, 200)
    addr = fake_server(lambda: frame(direct.SETTINGS, 0, 0, b"") + frame(
        direct.HEADERS, direct.END_HEADERS, 1,
        hpack.Encoder().encode([(":status", "200")])) + frame(direct.DATA, 0, 1, m[:60]))
    with pytest.raises(mz.RpcError) as e:
        receive(addr, bytearray(200))
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_views_cover_tensors_and_padding_in_order():
    a = torch.empty(3, dtype=torch.float32)     # 12 bytes, then 52 of padding
    b = torch.empty(20, dtype=torch.uint8)
    sink = stream._Sink([("a", 0, 12), ("b", 64, 20)], {"a": a, "b": b}, "cpu", 0)
    views = sink.views(0, 84)
    assert [len(v) for v in views] == [12, 52, 20]
    views[0][:] = bytes(range(12))
    views[2][:] = bytes(range(20))
    assert bytes(a.view(torch.uint8).numpy()) == bytes(range(12))
    assert bytes(b.numpy()) == bytes(range(20))
    assert [len(v) for v in sink.views(84, 0)] == []


def test_protocol_error_class_is_not_swallowed_as_success():
    # The receiver's own exception types stay distinct from the RPC error.
    assert not issubclass(ProtocolError, mz.RpcError)
    assert not issubclass(Unsupported, mz.RpcError)


def request_offset(raw):
    """The FetchRequest.offset a DirectFetch sent (its one DATA frame)."""
    pos = len(direct.PREFACE)
    while pos + 9 <= len(raw):
        n = int.from_bytes(raw[pos:pos + 3], "big")
        kind = raw[pos + 3]
        if kind == direct.DATA:
            msg = raw[pos + 9 + 5:pos + 9 + n]
            return pb.FetchRequest.FromString(msg).offset
        pos += 9 + n
    raise AssertionError("no request in what the client sent")


def resuming_server(first, second):
    """A server for two connections of one load. Each reads the client's
    request; the first is sent first(offset) and closed with no trailers
    (a broken stream), the second gets second(offset), a whole response.
    Returns (address, the offsets the two requests asked for)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    offsets = []

    def serve():
        for answer in (first, second):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                raw = b""
                while request_offset_or_none(raw) is None:
                    raw += conn.recv(1 << 16)
                offsets.append(request_offset(raw))
                conn.sendall(answer(offsets[-1]))
                if answer is second:
                    conn.recv(1 << 16)
        listener.close()
    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", offsets


def broken_response(messages):
    """A response that starts (status 200) and sends `messages`, with no
    trailers: the connection closes after them."""
    return (frame(direct.SETTINGS, 0, 0, b"")
            + frame(direct.HEADERS, direct.END_HEADERS, 1,
                    hpack.Encoder().encode([(":status", "200")]))
            + frame(direct.DATA, 0, 1, messages))


def direct_load(address, layout, total, dests):
    """Runs a verifying _DirectLoad of `layout` from `address` to the end
    (two tries), and returns it."""
    class FakeClient:
        retries = 2

        def direct_fetch(self, handle, *, offset=0, **fields):
            request = pb.FetchRequest(handle=handle, offset=offset).SerializeToString()
            return DirectFetch(address, request, idle_timeout=10)

    load = stream._DirectLoad(FakeClient(), "h-test", layout, total, {}, dests, "cpu", None,
                              True, 0, 0)
    load.start()
    load.wait()
    return load


def test_a_stream_that_breaks_resumes_from_the_next_byte():
    """The first connection breaks after 100 of 300 bytes; the load asks
    again from offset 100 and the tensor holds every byte once."""
    payload = bytes((7 * i) % 256 for i in range(300))
    address, offsets = resuming_server(
        lambda start: broken_response(chunk_message(0, payload[:100], 300)),
        lambda start: http2(chunk_message(start, payload[start:], 300),
                            digests_message(300, [("t", digest.of_bytes(payload))])))
    dest = torch.zeros(300, dtype=torch.uint8)
    load = direct_load(address, [("t", 0, 300)], 300, {"t": dest})
    assert offsets == [0, 100]
    assert load.received == 300
    assert bytes(dest.numpy()) == payload


def request_offset_or_none(raw):
    try:
        return request_offset(raw)
    except Exception:  # noqa: BLE001 - not all of it arrived yet
        return None


def test_a_server_certificate_from_another_ca_is_refused(pki, direct_runs):  # noqa: F811
    # The client trusts only the CA it names: the server's certificate is
    # signed by "ca", the client names "other-ca". Neither receiver loads.
    with serverproc.running_server([f"--tls_cert={pki / 'server.pem'}",
                                    f"--tls_key={pki / 'server.key'}",
                                    f"--tls_client_ca={pki / 'ca.pem'}"], connect=False) as s:
        port = s.address.rsplit(":", 1)[1]
        tls = mz.TLS(root_certificates=pki / "other-ca.pem",
                     certificate_chain=pki / "alice.pem", private_key=pki / "alice.key")
        with mz.Client(f"127.0.0.1:{port}", tls=tls, session=False, deadline=5) as c:
            fetch = c.direct_fetch("h-" + "0" * 32)
            with pytest.raises(Unsupported, match="TLS"):
                fetch.run(lambda o, n: [], lambda v: None, lambda *a: None)
        assert direct_runs == []
