"""Structured logs (--log_format=json): every line is a JSON object with a
zoned RFC 3339 time; one rpc line per call with peer, client, method,
handle, code, duration and sizes; fetch start/resume/end lines; session
ends list the handles they released; no token, key, resume token or
request content ever appears."""

import collections
import datetime
import json
import re
import subprocess
import threading
import time

import grpc
import pytest

import serverproc

TOKEN = "s3cret-bearer-token-0123456789abcdef"
# A value only the request body carries (an init parameter): it must not
# reach the log.
SENTINEL_STD = 0.0123456789
TIME_RE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d$")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a token file."""
    d = tmp_path_factory.mktemp("logs-pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            "server.ext", "-out", "server.pem", cwd=d)
    (d / "tokens.txt").write_text(f"{TOKEN} trainer-7\n")
    return d


def secure_stub(srv, tls, pb_grpc, token):
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(
            root_certificates=(tls / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(token))
    channel = grpc.secure_channel(srv.address, creds)
    grpc.channel_ready_future(channel).result(timeout=30)
    return channel, pb_grpc.MaterializerStub(channel)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text, [line for line in text.splitlines() if line.strip()]


def test_json_lines_for_every_call_and_nothing_secret(tls):
    pb, pb_grpc = serverproc.import_protos()
    args = ["--log_format=json", "--log_level=info",
            f"--tls_cert={tls / 'server.pem'}",
            f"--tls_key={tls / 'server.key'}",
            f"--token_file={tls / 'tokens.txt'}", "--session_grace=0.2s"]
    done = collections.Counter()
    with serverproc.running_server(args, connect=False) as srv:
        channel, stub = secure_stub(srv, tls, pb_grpc, TOKEN)
        model = pb.ModelSpec(
            tensors=[pb.TensorSpec(name="layer.weight", shape=[64, 64],
                                   dtype="float32")],
            init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
                normal=pb.Normal(std=SENTINEL_STD)))],
            seed=11)
        made = stub.Materialize(pb.MaterializeRequest(model=model),
                                timeout=60)
        done["Materialize"] += 1
        stub.Describe(pb.DescribeRequest(handle=made.handle), timeout=60)
        done["Describe"] += 1
        chunks = list(stub.FetchWeights(pb.FetchRequest(handle=made.handle),
                                        timeout=60))
        total = chunks[0].total_bytes
        resumed = list(stub.FetchWeights(
            pb.FetchRequest(handle=made.handle, offset=total - 100),
            timeout=60))
        done["FetchWeights"] += 2
        assert sum(len(c.data) for c in resumed) == 100
        missing = "h-" + "f" * 32
        with pytest.raises(grpc.RpcError) as e:
            stub.Release(pb.ReleaseRequest(handle=missing), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        done["Release"] += 1

        # A session holding one handle, ended by closing its stream.
        def requests(stop):
            yield pb.AttachRequest()
            stop.wait()
        stop = threading.Event()
        attach = stub.Attach(requests(stop))
        first = next(attach)
        done["Attach"] += 1
        bound = stub.Materialize(
            pb.MaterializeRequest(model=model), timeout=60,
            metadata=(("x-materializer-session", first.session_id),))
        done["Materialize"] += 1
        stop.set()
        for _ in attach:
            pass
        deadline = time.monotonic() + 10
        while True:
            stats = stub.GetStats(pb.GetStatsRequest(), timeout=60)
            done["GetStats"] += 1
            if stats.handles == 1:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stub.Release(pb.ReleaseRequest(handle=made.handle), timeout=60)
        done["Release"] += 1
        channel.close()

        # A wrong token is refused before any handler: no rpc line, and
        # the token is not logged either.
        bad_channel, bad_stub = secure_stub(srv, tls, pb_grpc,
                                            "wrong-token-" + "x" * 20)
        with pytest.raises(grpc.RpcError) as e:
            bad_stub.GetStats(pb.GetStatsRequest(), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bad_channel.close()
        # The session's end line follows the release GetStats saw.
        deadline = time.monotonic() + 10
        while True:
            text, lines = read_lines(srv.log_path)
            if '"event":"session_end"' in text:
                break
            assert time.monotonic() < deadline, "no session_end line"
            time.sleep(0.05)

    # Every line is one JSON object with time (zoned), level and source.
    events = []
    for line in lines:
        obj = json.loads(line)
        assert TIME_RE.match(obj["time"]), obj["time"]
        datetime.datetime.fromisoformat(obj["time"])
        assert obj["level"] in ("debug", "info", "warning", "error")
        assert re.match(r"^[a-z_]+\.cc:\d+$", obj["source"]), obj["source"]
        assert ("msg" in obj) != ("event" in obj), obj
        events.append(obj)

    rpcs = [e for e in events if e.get("event") == "rpc"]
    assert collections.Counter(e["method"] for e in rpcs) == done
    for e in rpcs:
        assert set(e) >= {"peer", "client", "method", "session", "handle",
                          "code", "duration_ms", "request_bytes",
                          "response_bytes", "error"}, e
        assert e["client"] == "trainer-7"
        assert e["peer"].startswith("ipv4:127.0.0.1:"), e["peer"]
        assert isinstance(e["duration_ms"], float) and e["duration_ms"] >= 0
        assert isinstance(e["request_bytes"], int)

    def one(method, **match):
        found = [e for e in rpcs if e["method"] == method and
                 all(e[k] == v for k, v in match.items())]
        assert len(found) == 1, (method, match, found)
        return found[0]

    # Materialize names the handle it created; the bound one its session.
    m = one("Materialize", handle=made.handle)
    assert m["code"] == "OK" and m["session"] == ""
    assert m["response_bytes"] == made.ByteSize()
    assert one("Materialize", handle=bound.handle)["session"] == \
        first.session_id
    one("Describe", handle=made.handle, code="OK")
    failed = one("Release", handle=missing)
    assert failed["code"] == "NOT_FOUND"
    assert "not found" in failed["error"].lower()
    one("Release", handle=made.handle, code="OK")
    one("Attach", session=first.session_id, code="OK")

    # Fetches: start, resume, and an end for each with the bytes sent.
    starts = [e for e in events if e.get("event") == "fetch_start"]
    resumes = [e for e in events if e.get("event") == "fetch_resume"]
    ends = [e for e in events if e.get("event") == "fetch_end"]
    assert [(e["handle"], e["offset"], e["total_bytes"]) for e in starts] == \
        [(made.handle, 0, total)]
    assert [(e["handle"], e["offset"]) for e in resumes] == \
        [(made.handle, total - 100)]
    assert sorted((e["offset"], e["bytes"], e["complete"], e["digest_sent"])
                  for e in ends) == [(0, total, True, True),
                                     (total - 100, 100, True, True)]
    # On the wire: the data plus each chunk's framing.
    fetch_rpcs = [e for e in rpcs if e["method"] == "FetchWeights"]
    assert sorted(e["response_bytes"] for e in fetch_rpcs)[0] > 100
    assert sum(e["response_bytes"] for e in fetch_rpcs) > total + 100

    # The session's end lists what it released.
    session_ends = [e for e in events if e.get("event") == "session_end"]
    assert len(session_ends) == 1
    end = session_ends[0]
    assert end["session"] == first.session_id
    assert end["client"] == "trainer-7"
    assert end["handles"] == [bound.handle]
    assert end["freed_bytes"] == bound.arena_bytes
    assert end["since_detach_ms"] >= 200

    # Nothing secret or from a request body.
    for secret in (TOKEN, "wrong-token-", first.resume_token,
                   str(SENTINEL_STD), "BEGIN", "PRIVATE"):
        assert secret not in text, secret


def test_text_format_stays_the_default():
    with serverproc.running_server(["--log_level=info"]) as srv:
        srv.stats("someone")
        log_path = srv.log_path
        _, lines = read_lines(log_path)
    assert lines, "no log lines"
    for line in lines:
        assert re.match(r"^[DIWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \S+\.cc:\d+\] ",
                        line), line
    rpc = [line for line in lines if "] rpc " in line]
    assert len(rpc) == 1
    assert "method=GetStats" in rpc[0] and "client=someone" in rpc[0]
    assert "code=OK" in rpc[0]


def test_unknown_log_format_is_refused():
    with pytest.raises(pytest.fail.Exception) as failed:
        with serverproc.running_server(["--log_format=yaml"]):
            pass
    assert "--log_format must be text or json" in str(failed.value)


def test_json_mode_routes_grpcs_own_lines_too(tls):
    """gRPC logs a failed TLS handshake itself; in JSON mode that line is
    JSON like every other, with gRPC's source file and level."""
    import socket
    args = ["--log_format=json", "--log_level=info",
            f"--tls_cert={tls / 'server.pem'}",
            f"--tls_key={tls / 'server.key'}",
            f"--token_file={tls / 'tokens.txt'}"]
    with serverproc.running_server(args, connect=False) as srv:
        port = int(srv.address.rsplit(":", 1)[1])
        # A plaintext gRPC client on the TLS port, and raw bytes that are
        # not a TLS hello: each is a failed handshake on the server.
        plain = grpc.insecure_channel(srv.address)
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(plain).result(timeout=2)
        plain.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64)
            try:
                s.recv(100)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while "Handshake failed" not in read_lines(srv.log_path)[0]:
            assert time.monotonic() < deadline, \
                "gRPC logged no failed handshake:\n" + \
                read_lines(srv.log_path)[0]
            time.sleep(0.05)
        # The server still serves.
        channel, stub = secure_stub(srv, tls, serverproc.import_protos()[1],
                                    TOKEN)
        channel.close()
        text, lines = read_lines(srv.log_path)

    handshakes = []
    for line in lines:
        obj = json.loads(line)  # every line, gRPC's included
        assert TIME_RE.match(obj["time"]), obj["time"]
        assert obj["level"] in ("debug", "info", "warning", "error")
        assert re.match(r"^[a-z0-9_]+\.cc:\d+$", obj["source"]), obj["source"]
        if "Handshake failed" in obj.get("msg", ""):
            handshakes.append(obj)
    assert handshakes, text
    assert all(h["level"] == "error" for h in handshakes), handshakes
    assert any(h["source"].startswith("ssl_transport_security.cc:")
               for h in handshakes), handshakes
