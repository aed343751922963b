"""Identity from authentication: mTLS (certificates generated here with
openssl) and bearer tokens over TLS; a caller without a valid identity gets
nothing done."""

import os
import subprocess
import textwrap

import grpc
import pytest

import serverproc


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost, client
    certificates (good, from another CA, expired)."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", f"/CN={ca}", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr", cwd=d)
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            "server.ext", "-out", "server.pem", cwd=d)
    for name, ca in (("alice", "ca"), ("mallory", "other-ca")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
                "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
                "-out", f"{name}.pem", cwd=d)
    # Expired: signed by the right CA, valid only in 2020 (openssl ca can
    # set the dates; x509 -req cannot).
    (d / "ca.cnf").write_text(textwrap.dedent(f"""\
        [ca]
        default_ca = test
        [test]
        dir = {d}
        database = {d}/index.txt
        new_certs_dir = {d}
        serial = {d}/serial
        default_md = sha256
        policy = any
        [any]
        commonName = supplied
        """))
    (d / "index.txt").write_text("")
    (d / "serial").write_text("1000\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=old-alice",
            "-keyout", "old.key", "-out", "old.csr", cwd=d)
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile",
            "ca.key", "-in", "old.csr", "-out", "old.pem", "-startdate",
            "20200101000000Z", "-enddate", "20200102000000Z", cwd=d)
    return d


def read(path):
    with open(path, "rb") as f:
        return f.read()


def channel(srv_address, pki, cert=None, token=None):
    port = srv_address.rsplit(":", 1)[1]
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(pki / "ca.pem"),
        private_key=read(pki / f"{cert}.key") if cert else None,
        certificate_chain=read(pki / f"{cert}.pem") if cert else None)
    if token is not None:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(f"localhost:{port}", creds)


def stats_via(ch, pb_grpc, pb, timeout=10):
    return pb_grpc.MaterializerStub(ch).GetStats(pb.GetStatsRequest(),
                                                 timeout=timeout)


def materialize_via(ch, pb_grpc, pb):
    return pb_grpc.MaterializerStub(ch).Materialize(pb.MaterializeRequest(
        model=pb.ModelSpec(
            tensors=[pb.TensorSpec(name="w", shape=[256], dtype="float32")],
            init_rules=[pb.InitRule(pattern="*",
                                    init=pb.InitScheme(ones=pb.Ones()))])),
        timeout=30)


def tls_server(pki, extra):
    return serverproc.running_server(
        [f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
         *extra], connect=False)


def test_mtls_identity_is_the_certificate(pki):
    pb, pb_grpc = serverproc.import_protos()
    with tls_server(pki, [f"--tls_client_ca={pki / 'ca.pem'}"]) as srv:
        good = channel(srv.address, pki, cert="alice")
        resp = materialize_via(good, pb_grpc, pb)
        info = pb_grpc.MaterializerStub(good).Describe(
            pb.DescribeRequest(handle=resp.handle), timeout=10)
        assert info.owner == "alice"  # the certificate's CN, not a field
        # Metadata cannot claim another identity.
        s = pb_grpc.MaterializerStub(good).GetStats(
            pb.GetStatsRequest(), metadata=(("x-materializer-client", "bob"),),
            timeout=10)
        assert [c.client for c in s.clients] == ["alice"]
        for bad in (None, "mallory", "old"):
            with pytest.raises(grpc.RpcError) as e:
                stats_via(channel(srv.address, pki, cert=bad), pb_grpc, pb,
                          timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, bad
        pb_grpc.MaterializerStub(good).Release(
            pb.ReleaseRequest(handle=resp.handle), timeout=10)


def test_bearer_tokens(pki, tmp_path):
    pb, pb_grpc = serverproc.import_protos()
    tokens = tmp_path / "tokens"
    tokens.write_text("# test tokens\n"
                      "tok-0123456789abcdef trainer-a\n"
                      "tok-fedcba9876543210 trainer-b\n")
    with tls_server(pki, [f"--token_file={tokens}"]) as srv:
        a = channel(srv.address, pki, token="tok-0123456789abcdef")
        resp = materialize_via(a, pb_grpc, pb)
        assert pb_grpc.MaterializerStub(a).Describe(
            pb.DescribeRequest(handle=resp.handle), timeout=10).owner == "trainer-a"
        # trainer-b cannot see trainer-a's handle.
        b = channel(srv.address, pki, token="tok-fedcba9876543210")
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.MaterializerStub(b).Describe(
                pb.DescribeRequest(handle=resp.handle), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        for bad in (None, "tok-not-a-real-token-1"):
            ch = channel(srv.address, pki, token=bad)
            with pytest.raises(grpc.RpcError) as e:
                materialize_via(ch, pb_grpc, pb)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, bad
        # Nothing was done for the refused calls.
        s = stats_via(a, pb_grpc, pb)
        assert s.handles == 1 and len(s.clients) == 1
        pb_grpc.MaterializerStub(a).Release(
            pb.ReleaseRequest(handle=resp.handle), timeout=10)
        assert stats_via(a, pb_grpc, pb).handles == 0


def test_tls_without_client_auth_is_refused(pki):
    proc = subprocess.run(
        [serverproc.SERVER_BIN, "--listen=127.0.0.1:0", "--devices=cpu",
         f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--tls_client_ca" in proc.stderr and "--token_file" in proc.stderr


def test_insecure_mode_refuses_non_loopback():
    proc = subprocess.run(
        [serverproc.SERVER_BIN, "--listen=0.0.0.0:0", "--devices=cpu"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "refusing to listen" in proc.stderr
