"""The plaintext health listener (--health_listen) that Kubernetes probes
use while the main port requires TLS: it answers grpc.health.v1 Check,
serves nothing else, and turns NOT_SERVING when a drain begins."""

import re
import signal
import subprocess
import time

import grpc
import pytest

import serverproc

MAIN_SERVICE = "materializer.v1.Materializer"
TOKEN = "deploy-test-token-0123456789"
HEALTH_LOG_RE = re.compile(r"health checks \(plaintext, grpc\.health\.v1 only\) "
                           r"on (\S+)")

# grpc.health.v1 by hand (two one-field messages), so the test needs no
# generated health module: HealthCheckRequest{string service = 1},
# HealthCheckResponse{ServingStatus status = 1}.
SERVING, NOT_SERVING = 1, 2


def encode_request(service):
    data = service.encode()
    assert len(data) < 128
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def decode_status(response):
    if not response:
        return 0  # proto3 default: UNKNOWN
    assert response[0] == 0x08 and len(response) == 2, response
    return response[1]


def check(address, service, timeout=5):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/grpc.health.v1.Health/Check")
        return decode_status(call(encode_request(service), timeout=timeout))


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """A server whose main port requires TLS and a bearer token, with the
    health listener on another loopback port."""
    d = tmp_path_factory.mktemp("deploy-pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            "server.ext", "-out", "server.pem", cwd=d)
    (d / "tokens.txt").write_text(f"{TOKEN} prober\n")
    args = [f"--tls_cert={d / 'server.pem'}", f"--tls_key={d / 'server.key'}",
            f"--token_file={d / 'tokens.txt'}",
            "--health_listen=127.0.0.1:0"]
    with serverproc.running_server(args, cpu_capacity="1GiB",
                                   log_level="info", connect=False) as srv:
        srv.health = health_address(srv.log_path)
        srv.ca = (d / "ca.pem").read_bytes()
        yield srv


def health_address(log_path):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            m = HEALTH_LOG_RE.search(f.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    pytest.fail("the server logged no health listener address")


def tls_channel(srv):
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=srv.ca),
        grpc.access_token_call_credentials(TOKEN))
    return grpc.secure_channel(srv.address, creds)


def test_health_port_answers_serving_in_plaintext(tls_server):
    assert tls_server.health != tls_server.address
    assert check(tls_server.health, "") == SERVING
    assert check(tls_server.health, MAIN_SERVICE) == SERVING
    with pytest.raises(grpc.RpcError) as e:
        check(tls_server.health, "no.such.Service")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_main_port_requires_tls_while_health_port_does_not(tls_server):
    # Plaintext to the main port: the TLS handshake fails.
    with pytest.raises(grpc.RpcError) as e:
        check(tls_server.address, "", timeout=3)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # With TLS and a token, the main port serves Materializer.
    pb, pb_grpc = serverproc.import_protos()
    with tls_channel(tls_server) as channel:
        stats = pb_grpc.MaterializerStub(channel).GetStats(
            pb.GetStatsRequest(), timeout=10)
    assert [c.client for c in stats.clients] in ([], ["prober"])
    assert stats.devices


def test_health_port_serves_nothing_else(tls_server):
    pb, pb_grpc = serverproc.import_protos()
    with grpc.insecure_channel(tls_server.health) as channel:
        stub = pb_grpc.MaterializerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.GetStats(pb.GetStatsRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "serves only grpc.health.v1.Health" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Plan(pb.PlanRequest(), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # No reflection either (it would list the main port's services).
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as e:
            list(reflect(iter([b"\x3a\x00"]), timeout=5))  # list_services
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_health_goes_not_serving_when_the_drain_begins(tmp_path):
    """SIGTERM while a fetch is stalled (its client reads nothing): the
    server waits for the call up to its drain deadline, and meanwhile the
    health port answers NOT_SERVING, so probes take the pod out of
    rotation before the port closes."""
    pb, pb_grpc = serverproc.import_protos()
    log = tmp_path / "server.log"
    cmd = [serverproc.SERVER_BIN, "--listen=127.0.0.1:0",
           "--health_listen=127.0.0.1:0", "--devices=cpu",
           "--cpu_capacity=1GiB", "--log_level=info"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline().decode()
        m = serverproc.LISTEN_RE.match(line)
        assert m, (line, log.read_text())
        address, health = m.group(1), health_address(log)
        assert check(health, MAIN_SERVICE) == SERVING

        channel = grpc.insecure_channel(address)
        stub = pb_grpc.MaterializerStub(channel)
        req = pb.MaterializeRequest()
        t = req.model.tensors.add(name="w", shape=[16 << 20], dtype="float32")
        t.init.zeros.SetInParent()
        handle = stub.Materialize(req, timeout=60).handle
        # 64 MiB: far more than gRPC's flow-control windows, so the stream
        # stalls until the client reads, which it does not.
        stream = stub.FetchWeights(pb.FetchRequest(handle=handle),
                                   timeout=120)
        next(stream)

        proc.send_signal(signal.SIGTERM)
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                seen.append(check(health, MAIN_SERVICE, timeout=1))
            except grpc.RpcError as e:
                seen.append(e.code())
            if seen[-1] == NOT_SERVING:
                break
            time.sleep(0.05)
        assert seen and seen[-1] == NOT_SERVING, seen
        assert proc.poll() is None, "the server exited instead of draining"
        assert check(health, "") == NOT_SERVING
        stream.cancel()
        channel.close()
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_server_on_the_same_main_port_refuses_to_start():
    """gRPC's default SO_REUSEPORT would let a second materializerd share a
    busy port and take part of the new connections, each server with its own
    ledger and handles. The second one must exit with a clear error."""
    with serverproc.running_server() as first:
        proc = subprocess.run(
            [serverproc.SERVER_BIN, f"--listen={first.address}",
             "--devices=cpu", "--cpu_capacity=64MiB"],
            capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL)
        assert proc.returncode != 0, (proc.stdout, proc.stderr[-2000:])
        assert "listening" not in proc.stdout, proc.stdout
        assert f"cannot listen on {first.address}" in proc.stderr, \
            proc.stderr[-2000:]
        # The first server still owns the port and answers.
        assert first.stats().devices, "the first server stopped answering"
