"""matctl in every identity mode, through the real binary: TLS with a CA,
mTLS with a client certificate, bearer tokens from a file, from
MATERIALIZER_TOKEN and from MATERIALIZER_TOKEN_FILE; good and bad
credentials give their exit codes (docs/api.md, "matctl"), and a token is
never printed, not even with --verbose."""

import json
import os
import subprocess

import pytest

import certs
import serverproc

MATCTL = os.environ.get(
    "MATCTL", os.path.join(serverproc.REPO, "bazel-bin", "client", "matctl"))

TOKEN_A = "tok-a-0123456789abcdef-never-shown"
TOKEN_B = "tok-b-fedcba9876543210-never-shown"
EXIT_USAGE, EXIT_DENIED, EXIT_UNAVAILABLE = 2, 4, 6


def matctl(*args, env=None, timeout=60):
    """Runs matctl with only the MATERIALIZER_* variables in `env`."""
    if not os.path.exists(MATCTL):
        pytest.fail(f"matctl not found at {MATCTL} (bazel build //client:matctl)",
                    pytrace=False)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MATERIALIZER_")}
    base.update(env or {})
    return subprocess.run([MATCTL, *args], capture_output=True, text=True,
                          env=base, timeout=timeout)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.json"
    path.write_text(json.dumps({"model": {
        "tensors": [{"name": "w", "shape": [64], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}))
    return str(path)


def tls_server(pki, extra):
    return serverproc.running_server(
        [f"--tls_cert={pki.server_cert}", f"--tls_key={pki.server_key}",
         *extra], connect=False)


@pytest.fixture(scope="module")
def mtls(pki):
    with tls_server(pki, [f"--tls_client_ca={pki.ca}"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(pki, tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    path.write_text(f"{TOKEN_A} trainer-a\n{TOKEN_B} trainer-b\n")
    with tls_server(pki, [f"--token_file={path}"]) as srv:
        yield srv


def token_file(tmp_path, token, name="token"):
    path = tmp_path / name
    path.write_text(token + "\n")
    return str(path)


def materialize_and_owner(server_args, model_file, env=None):
    """Materializes through matctl, returns (owner, handle) from describe."""
    made = matctl(*server_args, "--output=json", "materialize", model_file,
                  env=env)
    assert made.returncode == 0, made.stderr
    handle = json.loads(made.stdout)["handle"]
    info = matctl(*server_args, "--output=json", "describe", handle, env=env)
    assert info.returncode == 0, info.stderr
    released = matctl(*server_args, "release", handle, env=env)
    assert released.returncode == 0, released.stderr
    return json.loads(info.stdout)["owner"], handle


def test_mtls_identity_is_the_certificate(pki, mtls, model_file):
    cert, key = pki.client("alice")
    owner, _ = materialize_and_owner(
        [f"--server={mtls.address}", f"--tls_ca={pki.ca}",
         f"--tls_cert={cert}", f"--tls_key={key}"], model_file)
    assert owner == "alice"
    # The same through the environment only.
    owner, _ = materialize_and_owner([], model_file, env={
        "MATERIALIZER_SERVER": mtls.address, "MATERIALIZER_TLS_CA": str(pki.ca),
        "MATERIALIZER_TLS_CERT": str(cert), "MATERIALIZER_TLS_KEY": str(key)})
    assert owner == "alice"
    # The development-mode name is not an identity here.
    owner, _ = materialize_and_owner(
        [f"--server={mtls.address}", f"--tls_ca={pki.ca}",
         f"--tls_cert={cert}", f"--tls_key={key}", "--client=bob"], model_file)
    assert owner == "alice"


def test_mtls_refusals_are_authentication_failures(pki, mtls):
    alice_cert, alice_key = pki.client("alice")
    mallory_cert, mallory_key = pki.client("mallory", ca="other-ca")
    tls = [f"--server={mtls.address}", f"--tls_ca={pki.ca}", "--timeout=10s"]

    no_cert = matctl(*tls, "ls")
    assert no_cert.returncode == EXIT_DENIED, no_cert.stderr
    assert "requires a client certificate" in no_cert.stderr

    wrong_ca = matctl(*tls, f"--tls_cert={mallory_cert}",
                      f"--tls_key={mallory_key}", "ls")
    assert wrong_ca.returncode == EXIT_DENIED, wrong_ca.stderr
    assert f"refused the client certificate {mallory_cert}" in wrong_ca.stderr

    untrusted = matctl(f"--server={mtls.address}", f"--tls_ca={pki.other_ca}",
                       f"--tls_cert={alice_cert}", f"--tls_key={alice_key}",
                       "--timeout=10s", "ls")
    assert untrusted.returncode == EXIT_DENIED, untrusted.stderr
    assert "certificate was not trusted" in untrusted.stderr
    # gRPC's own log line about the handshake is not printed on top.
    assert "ssl_transport_security" not in untrusted.stderr

    plaintext = matctl(f"--server={mtls.address}", "--timeout=10s", "ls")
    assert plaintext.returncode == EXIT_UNAVAILABLE, plaintext.stderr
    assert "if it uses TLS, give --tls_ca" in plaintext.stderr


def test_tls_to_a_plaintext_server_says_so(pki, server):
    r = matctl(f"--server={server.address}", f"--tls_ca={pki.ca}",
               "--timeout=10s", "health")
    assert r.returncode == EXIT_UNAVAILABLE, r.stderr
    assert "does not seem to speak TLS" in r.stderr


def test_tokens_from_a_file_the_variable_or_its_file(pki, tokens, model_file,
                                                     tmp_path):
    tls = [f"--server={tokens.address}", f"--tls_ca={pki.ca}"]
    path_a = token_file(tmp_path, TOKEN_A)
    owner, _ = materialize_and_owner([*tls, f"--token_file={path_a}"],
                                     model_file)
    assert owner == "trainer-a"
    owner, _ = materialize_and_owner(tls, model_file,
                                     env={"MATERIALIZER_TOKEN": TOKEN_B})
    assert owner == "trainer-b"
    owner, _ = materialize_and_owner(
        tls, model_file, env={"MATERIALIZER_TOKEN_FILE": path_a})
    assert owner == "trainer-a"
    # --token_file wins over the variables.
    owner, _ = materialize_and_owner(
        [*tls, f"--token_file={path_a}"], model_file,
        env={"MATERIALIZER_TOKEN": TOKEN_B})
    assert owner == "trainer-a"


def test_one_identity_cannot_see_anothers_handle(pki, tokens, model_file):
    tls = [f"--server={tokens.address}", f"--tls_ca={pki.ca}"]
    made = matctl(*tls, "--output=json", "materialize", model_file,
                  env={"MATERIALIZER_TOKEN": TOKEN_A})
    assert made.returncode == 0, made.stderr
    handle = json.loads(made.stdout)["handle"]
    other = matctl(*tls, "describe", handle, env={"MATERIALIZER_TOKEN": TOKEN_B})
    assert other.returncode == 3, other.stderr  # not found, as if never issued
    assert matctl(*tls, "release", handle,
                  env={"MATERIALIZER_TOKEN": TOKEN_A}).returncode == 0


def test_bad_missing_or_misplaced_tokens(pki, tokens, tmp_path):
    tls = [f"--server={tokens.address}", f"--tls_ca={pki.ca}", "--timeout=10s"]
    bad = "tok-not-a-real-token-0123456789"
    refused = matctl(*tls, "--verbose", "ls", env={"MATERIALIZER_TOKEN": bad})
    assert refused.returncode == EXIT_DENIED, refused.stderr
    assert "did not accept the token from MATERIALIZER_TOKEN" in refused.stderr
    assert bad not in refused.stdout + refused.stderr

    missing = matctl(*tls, "ls")
    assert missing.returncode == EXIT_DENIED, missing.stderr
    assert "the server wants an identity" in missing.stderr

    no_tls = matctl(f"--server={tokens.address}", "ls",
                    env={"MATERIALIZER_TOKEN": TOKEN_A})
    assert no_tls.returncode == EXIT_USAGE, no_tls.stderr
    assert "sent only over TLS" in no_tls.stderr

    both = matctl(*tls, "ls", env={
        "MATERIALIZER_TOKEN": TOKEN_A,
        "MATERIALIZER_TOKEN_FILE": token_file(tmp_path, TOKEN_B)})
    assert both.returncode == EXIT_USAGE, both.stderr
    assert "both MATERIALIZER_TOKEN and MATERIALIZER_TOKEN_FILE" in both.stderr

    unreadable = matctl(*tls, f"--token_file={tmp_path / 'nope'}", "ls")
    assert unreadable.returncode == EXIT_USAGE, unreadable.stderr
    assert "token file" in unreadable.stderr


def test_a_certificate_without_the_token_is_told_to_add_the_token(
        pki, tmp_path):
    """A server with a client CA and a token file takes the certificate in
    the handshake and still wants a token on every call: the hint asks for
    the token, not for a certificate the client already gave."""
    path = tmp_path / "tokens.txt"
    path.write_text(f"{TOKEN_A} trainer-a\n")
    cert, key = pki.client("alice")
    with tls_server(pki, [f"--tls_client_ca={pki.ca}",
                          f"--token_file={path}"]) as srv:
        args = [f"--server={srv.address}", f"--tls_ca={pki.ca}",
                f"--tls_cert={cert}", f"--tls_key={key}", "--timeout=10s"]
        refused = matctl(*args, "ls")
        assert refused.returncode == EXIT_DENIED, refused.stderr
        hints = [line for line in refused.stderr.splitlines()
                 if line.startswith("hint: ")]
        assert hints == [
            "hint: the server took the client certificate but wants a bearer "
            "token on every call too: give --token_file, "
            "MATERIALIZER_TOKEN_FILE or MATERIALIZER_TOKEN"], refused.stderr
        served = matctl(*args, "ls", env={"MATERIALIZER_TOKEN": TOKEN_A})
        assert served.returncode == 0, served.stderr


def test_a_token_is_never_printed(pki, tokens, model_file, tmp_path):
    """Every source, successful and failing commands, --verbose and JSON."""
    tls = [f"--server={tokens.address}", f"--tls_ca={pki.ca}", "--verbose"]
    path_a = token_file(tmp_path, TOKEN_A)
    runs = [
        matctl(*tls, f"--token_file={path_a}", "stats"),
        matctl(*tls, "--output=json", "ls", env={"MATERIALIZER_TOKEN": TOKEN_A}),
        matctl(*tls, "health", env={"MATERIALIZER_TOKEN_FILE": path_a}),
        matctl(*tls, "describe", "h-00000000000000000000000000000000",
               env={"MATERIALIZER_TOKEN": TOKEN_A}),
        matctl(*tls, "materialize", "/nonexistent.json",
               env={"MATERIALIZER_TOKEN": TOKEN_A}),
        matctl(f"--server={tokens.address}", "--verbose", "ls",
               env={"MATERIALIZER_TOKEN": TOKEN_A}),
        matctl(*tls, "--server=127.0.0.1:1", "ls",
               env={"MATERIALIZER_TOKEN": TOKEN_A}),
    ]
    codes = [r.returncode for r in runs]
    assert codes == [0, 0, 0, 3, 3, EXIT_USAGE, EXIT_UNAVAILABLE], \
        [(r.returncode, r.stderr) for r in runs]
    for r in runs:
        assert TOKEN_A not in r.stdout and TOKEN_A not in r.stderr, r
    # --verbose says where the token came from, and how long it is.
    assert f"bearer token from --token_file={path_a} ({len(TOKEN_A)} " \
           "characters)" in runs[0].stderr
    assert "bearer token from MATERIALIZER_TOKEN" in runs[1].stderr
