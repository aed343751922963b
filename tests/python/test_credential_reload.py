"""Credentials rotate on a running server: tokens added and removed, the
server certificate replaced (from the same CA, then from a new CA after the
client CA was widened), while handles live and an Attach session stays
open. Nothing held is lost, a removed token is refused from its next call,
new connections see the new certificate, and a corrupt replacement leaves
the old credentials working and shows in the log and the metrics
(docs/operations.md, "Rotating credentials")."""

import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time

import grpc
import pytest

import certs
import scrape
import serverproc

TOKEN_A = "alice-token-0123456789abcdef"
TOKEN_A2 = "alice-token-rotated-0123456789"
TOKEN_B = "bob-token-0123456789abcdefgh"
RELOADS = "materializer_credential_reloads_total"
INTERVAL = "0.2s"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def server_cert(d, name, ca):
    """A server certificate for 127.0.0.1/localhost signed by `ca`, with a
    key of its own: (cert path, key path)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
            "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
            "-extfile", "server.ext", "-out", f"{name}.pem", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("rotation-pki")
    p = certs.make_pki(d)  # ca, other-ca, server (from ca)
    server_cert(d, "server2", "ca")
    server_cert(d, "server3", "other-ca")
    p.client("alice")
    p.client("carol", ca="other-ca")
    (d / "both-cas.pem").write_bytes(p.ca.read_bytes() +
                                     p.other_ca.read_bytes())
    return p


def replace(path, data):
    """Atomically, as Kubernetes updates a mounted Secret."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    os.replace(tmp, path)


def channel(address, roots, client=None, token=None):
    """A channel with a connection of its own (no sharing with earlier
    channels), trusting `roots`, with a client certificate (a Pki client
    name) and/or a bearer token."""
    pki_dir = roots.parent
    creds = grpc.ssl_channel_credentials(
        root_certificates=roots.read_bytes(),
        private_key=(pki_dir / f"{client}.key").read_bytes() if client
        else None,
        certificate_chain=(pki_dir / f"{client}.pem").read_bytes() if client
        else None)
    if token is not None:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    port = address.rsplit(":", 1)[1]
    return grpc.secure_channel(f"localhost:{port}", creds, options=[
        ("grpc.use_local_subchannel_pool", 1)])


def served_certificate(address, roots, client):
    """The DER certificate a new TLS connection to `address` gets
    (verified against `roots`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(roots))
    context.load_cert_chain(str(roots.parent / f"{client}.pem"),
                            str(roots.parent / f"{client}.key"))
    context.set_alpn_protocols(["h2"])
    port = int(address.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def der(path):
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def eventually(check, what, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except Exception as e:  # pylint: disable=broad-except
            result, error = None, e
        else:
            error = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}"
                                 + (f" (last error: {error})" if error else ""))
        time.sleep(0.1)


def reloads(url, kind, result):
    return scrape.get(scrape.scrape(url), RELOADS, kind=kind, result=result)


def wait_reloads(url, kind, result, n):
    eventually(lambda: reloads(url, kind, result) == n,
               f"{RELOADS}{{kind={kind},result={result}}} == {n}")


class Session:
    """An open Attach stream on `stub`."""

    def __init__(self, pb, stub):
        self._stop = threading.Event()

        def requests():
            yield pb.AttachRequest()
            self._stop.wait()
        self.call = stub.Attach(requests())
        self.id = next(self.call).session_id

    def close(self):
        self._stop.set()
        for _ in self.call:
            pass


def model(pb):
    return pb.ModelSpec(
        tensors=[pb.TensorSpec(name="w", shape=[1024], dtype="float32")],
        init_rules=[pb.InitRule(pattern="*",
                                init=pb.InitScheme(ones=pb.Ones()))])


def listed(stub, pb):
    return sorted(h.handle for h in stub.ListHandles(
        pb.ListHandlesRequest(), timeout=30).handles)


def log_events(srv, kind):
    """The credential_reload events of `kind` in a JSON-format log."""
    events = []
    with open(srv.log_path, encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            if obj.get("event") == "credential_reload" and \
                    obj.get("kind") == kind:
                events.append(obj)
    return events


def start(pki, live, extra=()):
    return serverproc.running_server(
        [f"--tls_cert={live / 'cert.pem'}", f"--tls_key={live / 'key.pem'}",
         f"--tls_client_ca={live / 'clients-ca.pem'}",
         "--metrics_listen=127.0.0.1:0", "--session_grace=0.5s",
         "--log_format=json", *extra],
        connect=False, log_level="info")


def test_tokens_rotate_without_losing_handles_or_the_session(pki, tmp_path):
    pb, pb_grpc = serverproc.import_protos()
    live = tmp_path
    replace(live / "cert.pem", pki.server_cert.read_bytes())
    replace(live / "key.pem", pki.server_key.read_bytes())
    replace(live / "clients-ca.pem", pki.ca.read_bytes())
    tokens = live / "tokens.txt"
    replace(tokens, f"{TOKEN_A} alice\n")
    with start(pki, live, [f"--token_file={tokens}",
                           f"--credential_check_interval={INTERVAL}"]) as srv:
        url = scrape.metrics_url(srv)
        assert reloads(url, "tokens", "ok") == 0
        old = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "alice", TOKEN_A))
        session = Session(pb, old)
        bound = old.Materialize(
            pb.MaterializeRequest(model=model(pb)), timeout=60,
            metadata=(("x-materializer-session", session.id),)).handle
        loose = old.Materialize(pb.MaterializeRequest(model=model(pb)),
                                timeout=60).handle
        bob = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "alice", TOKEN_B))
        with pytest.raises(grpc.RpcError) as e:
            bob.GetStats(pb.GetStatsRequest(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # A token added: bob's open channel works from its next call.
        replace(tokens, f"{TOKEN_A} alice\n{TOKEN_B} bob\n")
        wait_reloads(url, "tokens", "ok", 1)
        stats = bob.GetStats(pb.GetStatsRequest(), timeout=30)
        assert [c.client for c in stats.clients] == []  # bob holds nothing

        # Alice's token rotated, written in place (not atomically): the
        # old one is refused on the connection it already has; the new one
        # sees everything alice held, and her session is still open.
        with open(tokens, "w", encoding="ascii") as f:
            f.write(f"{TOKEN_A2} alice\n{TOKEN_B} bob\n")
        wait_reloads(url, "tokens", "ok", 2)
        with pytest.raises(grpc.RpcError) as e:
            old.GetStats(pb.GetStatsRequest(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token not recognised" in e.value.details()
        alice = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "alice", TOKEN_A2))
        assert listed(alice, pb) == sorted([bound, loose])
        info = alice.Describe(pb.DescribeRequest(handle=bound), timeout=30)
        assert info.owner == "alice"
        [mine] = alice.GetStats(pb.GetStatsRequest(), timeout=30).clients
        assert (mine.client, mine.handles, mine.sessions) == ("alice", 2, 1)
        assert not session.call.done()

        # A corrupt file: refused, logged, counted; every token in force
        # still works and the removed one stays refused.
        replace(tokens, "short alice\n")
        wait_reloads(url, "tokens", "error", 1)
        assert reloads(url, "tokens", "ok") == 2
        time.sleep(1)  # more polls: the same bad file is reported once
        assert reloads(url, "tokens", "error") == 1
        [error] = [e for e in log_events(srv, "tokens")
                   if e["result"] == "error"]
        assert error["level"] == "error"
        assert "at least 16 characters" in error["error"]
        assert "credentials in force stay" in error["error"]
        assert str(tokens) in error["files"]
        assert [e["detail"] for e in log_events(srv, "tokens")
                if e["result"] == "ok"] == ["2 tokens for 2 clients"] * 2
        bob.GetStats(pb.GetStatsRequest(), timeout=30)
        assert listed(alice, pb) == sorted([bound, loose])
        with pytest.raises(grpc.RpcError) as e:
            old.GetStats(pb.GetStatsRequest(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # The session was kept all along: ending it now releases its handle.
        session.close()
        eventually(lambda: listed(alice, pb) == [loose],
                   "the session's handle released after its grace")
        alice.Release(pb.ReleaseRequest(handle=loose), timeout=30)
        text = open(srv.log_path, encoding="utf-8").read()
        for secret in (TOKEN_A, TOKEN_A2, TOKEN_B):
            assert secret not in text


def test_server_certificate_and_client_ca_rotate(pki, tmp_path):
    pb, pb_grpc = serverproc.import_protos()
    live = tmp_path
    cert, key, clients = (live / "cert.pem", live / "key.pem",
                          live / "clients-ca.pem")
    replace(cert, pki.server_cert.read_bytes())
    replace(key, pki.server_key.read_bytes())
    replace(clients, pki.ca.read_bytes())
    both = pki.dir / "both-cas.pem"
    with start(pki, live, [f"--credential_check_interval={INTERVAL}"]) as srv:
        url = scrape.metrics_url(srv)
        assert served_certificate(srv.address, pki.ca, "alice") == \
            der(pki.server_cert)
        first = pb_grpc.MaterializerStub(channel(srv.address, pki.ca, "alice"))
        session = Session(pb, first)
        bound = first.Materialize(
            pb.MaterializeRequest(model=model(pb)), timeout=60,
            metadata=(("x-materializer-session", session.id),)).handle
        loose = first.Materialize(pb.MaterializeRequest(model=model(pb)),
                                  timeout=60).handle

        # A new certificate from the same CA (both files replaced, one
        # after the other): new connections get it; nothing is refused.
        replace(cert, (pki.dir / "server2.pem").read_bytes())
        replace(key, (pki.dir / "server2.key").read_bytes())
        wait_reloads(url, "certificate", "ok", 1)
        eventually(lambda: served_certificate(srv.address, pki.ca, "alice")
                   == der(pki.dir / "server2.pem"),
                   "new connections get server2's certificate")
        assert reloads(url, "certificate", "error") == 0
        fresh = pb_grpc.MaterializerStub(channel(srv.address, pki.ca, "alice"))
        assert listed(fresh, pb) == sorted([bound, loose])

        # A new CA: the client CA is widened first, so that clients with
        # certificates from it (carol) are accepted...
        carol = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "carol"))
        with pytest.raises(grpc.RpcError) as e:
            carol.GetStats(pb.GetStatsRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        replace(clients, both.read_bytes())
        wait_reloads(url, "client_ca", "ok", 1)
        eventually(lambda: pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "carol")).GetStats(
                pb.GetStatsRequest(), timeout=10) is not None,
            "carol's certificate accepted")
        # ... then the server's certificate comes from the new CA: clients
        # trusting only the old CA can no longer connect, those trusting
        # both can.
        replace(cert, (pki.dir / "server3.pem").read_bytes())
        replace(key, (pki.dir / "server3.key").read_bytes())
        wait_reloads(url, "certificate", "ok", 2)
        eventually(lambda: served_certificate(srv.address, both, "alice")
                   == der(pki.dir / "server3.pem"),
                   "new connections get server3's certificate")
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.MaterializerStub(channel(srv.address, pki.ca, "alice")) \
                .GetStats(pb.GetStatsRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        new_ca = pb_grpc.MaterializerStub(channel(srv.address, both, "alice"))
        assert listed(new_ca, pb) == sorted([bound, loose])
        # Connections opened before every change keep working.
        assert listed(first, pb) == sorted([bound, loose])
        assert not session.call.done()

        # Corrupt replacements: a damaged certificate, a key of another
        # certificate, a client CA that is not PEM. Each is refused,
        # logged and counted, and the server keeps serving server3 and
        # accepting both CAs' clients.
        good = (pki.dir / "server3.pem").read_text()
        replace(cert, good[:len(good) // 2])
        wait_reloads(url, "certificate", "error", 1)
        replace(cert, good)
        replace(key, (pki.dir / "server2.key").read_bytes())
        wait_reloads(url, "certificate", "error", 2)
        replace(clients, "not a certificate\n")
        wait_reloads(url, "client_ca", "error", 1)
        time.sleep(1.5)  # past a refresh of gRPC's certificate provider
        assert served_certificate(srv.address, both, "alice") == \
            der(pki.dir / "server3.pem")
        for who in ("alice", "carol"):
            stub = pb_grpc.MaterializerStub(channel(srv.address, both, who))
            stub.GetStats(pb.GetStatsRequest(), timeout=10)
        errors = [e["error"] for e in log_events(srv, "certificate")
                  if e["result"] == "error"]
        assert len(errors) == 2, errors
        assert "does not parse" in errors[0]
        assert "does not belong to the certificate" in errors[1]
        [ca_error] = [e["error"] for e in log_events(srv, "client_ca")
                      if e["result"] == "error"]
        assert "no PEM certificate" in ca_error
        oks = [e["detail"] for e in log_events(srv, "certificate")
               if e["result"] == "ok"]
        assert oks[0].startswith("CN=server2, valid until ")
        assert oks[1].startswith("CN=server3, valid until ")

        # Nothing held was lost: both handles, and the session, whose end
        # now releases its handle.
        assert listed(first, pb) == sorted([bound, loose])
        session.close()
        eventually(lambda: listed(new_ca, pb) == [loose],
                   "the session's handle released after its grace")
        new_ca.Release(pb.ReleaseRequest(handle=loose), timeout=30)


def test_sighup_reloads_at_once(pki, tmp_path):
    pb, pb_grpc = serverproc.import_protos()
    live = tmp_path
    replace(live / "cert.pem", pki.server_cert.read_bytes())
    replace(live / "key.pem", pki.server_key.read_bytes())
    replace(live / "clients-ca.pem", pki.ca.read_bytes())
    tokens = live / "tokens.txt"
    replace(tokens, f"{TOKEN_A} alice\n")
    # No polling: only SIGHUP reloads.
    with start(pki, live, [f"--token_file={tokens}",
                           "--credential_check_interval=0"]) as srv:
        url = scrape.metrics_url(srv)
        alice = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "alice", TOKEN_A))
        bob = pb_grpc.MaterializerStub(
            channel(srv.address, pki.ca, "alice", TOKEN_B))
        replace(tokens, f"{TOKEN_B} bob\n")
        time.sleep(1.5)
        alice.GetStats(pb.GetStatsRequest(), timeout=30)  # not yet
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(url, "tokens", "ok", 1)
        with pytest.raises(grpc.RpcError) as e:
            alice.GetStats(pb.GetStatsRequest(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        bob.GetStats(pb.GetStatsRequest(), timeout=30)
        # A refused file is reported at every SIGHUP, and bob keeps working.
        replace(tokens, "# nothing\n")
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(url, "tokens", "error", 1)
        srv.proc.send_signal(signal.SIGHUP)
        wait_reloads(url, "tokens", "error", 2)
        bob.GetStats(pb.GetStatsRequest(), timeout=30)
        # The unchanged certificate and client CA were read too, and left
        # alone.
        events = log_events(srv, "certificate")
        assert [e["result"] for e in events] == ["unchanged"] * 3
        assert reloads(url, "certificate", "ok") == 0
