"""The SDK when it cannot do its work: no server, TLS on one side only, a
missing client certificate, a refused token, a missing optional package.
Each fails within the connect timeout (measured here), as a
materializer.RpcError naming the user's call, the address and what to
check; the command line (`python -m materializer plan`) says it in one
line. And the settings that avoid those errors: `tls=` and `token=` on
materialize() and plan(), matctl's environment variables, the command
line's certificate and token options."""

import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from concurrent import futures

import grpc
import pytest
import torch
from torch import nn

import certs
import serverproc

import materializer as mz

PYTHON_DIR = os.path.join(serverproc.REPO, "python")
TOKEN = "tok-sdk-0123456789abcdef"
WRONG_TOKEN = "tok-sdk-not-a-listed-token"
# The acceptance bound for every failure below; the default connect timeout
# is 3 s, and failures that no retry changes come at once.
FAIL_WITHIN_S = 5.0
AT_ONCE_S = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pki = certs.make_pki(tmp_path_factory.mktemp("pki"))
    pki.client("alice")
    return pki


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    (d / "server-tokens").write_text(f"{TOKEN} trainer-t\n")
    (d / "token").write_text(TOKEN + "\n")
    return d


def tls_server(pki, extra):
    return serverproc.running_server(
        [f"--tls_cert={pki.server_cert}", f"--tls_key={pki.server_key}", *extra],
        connect=False)


@pytest.fixture(scope="module")
def mtls(pki):
    with tls_server(pki, [f"--tls_client_ca={pki.ca}"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokens(pki, token_files):
    with tls_server(pki, [f"--token_file={token_files / 'server-tokens'}"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_and_tokens(pki, token_files):
    """The shipped deployment's setup: client certificates and tokens."""
    with tls_server(pki, [f"--tls_client_ca={pki.ca}",
                          f"--token_file={token_files / 'server-tokens'}"]) as srv:
        yield srv


@pytest.fixture(autouse=True)
def no_materializer_variables(monkeypatch):
    """Each test sets the MATERIALIZER_* connection variables it wants."""
    for key in list(os.environ):
        if key.startswith("MATERIALIZER_") and key != "MATERIALIZER_PY_PROTO":
            monkeypatch.delenv(key)


def model():
    with mz.meta_device():
        return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))


def described():
    """A meta model and its spec, as keywords of materialize() and plan().
    The calls timed here are given the spec: describing is not connecting,
    and the first describe in a process that has imported transformers
    (as the suite's Hugging Face tests do) takes seconds, importing its
    modeling code to check whether the model is one of its classes."""
    m = model()
    return {"model": m, "spec": mz.describe(m)}


def free_port():
    """A port nothing listens on (bound and closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fails(call):
    """(the RpcError `call` raised, the seconds it took)."""
    t0 = time.monotonic()
    with pytest.raises(mz.RpcError) as e:
        call()
    return e.value, time.monotonic() - t0


def stats_of(address):
    with mz.Client(address, session=False) as client:
        return client.stats()


def test_a_server_that_is_down():
    address = f"127.0.0.1:{free_port()}"
    for name, call in (("materialize", mz.materialize), ("plan", mz.plan)):
        what = described()
        error, seconds = fails(functools.partial(call, **what, server=address))
        print(f"{name}, no server: failed in {seconds:.2f} s")
        assert seconds < FAIL_WITHIN_S, (seconds, str(error))
        assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "down"
        text = str(error)
        # The user's call and the address lead; the RPC inside is not named.
        assert text.startswith(f"{name}: cannot connect to {address} (UNAVAILABLE: "), text
        assert "GetStats" not in text and "Plan " not in text, text
        assert "Connection refused" in text or "connection refused" in text, text
        assert error.hint == (
            f"no server answered at {address}. Is materializerd running there? `./dev serve` "
            "starts one on 127.0.0.1:50051; server= (or MATERIALIZER_SERVER) points the SDK "
            "elsewhere")
        assert text.endswith("; hint: " + error.hint)


def test_a_model_that_cannot_be_described_fails_at_once_whatever_the_server():
    """materialize() asks the server for its devices while describe()
    records the model; when describe() fails, the call fails with its
    CaptureError at once, not after waiting for a server that is down."""
    class Unwritten(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.empty(3, 3, device="meta"))

    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(mz.CaptureError, match="nothing initializes it"):
        mz.materialize(Unwritten(), server=address, connect_timeout=30)
    assert time.monotonic() - t0 < 2.0


def test_the_connect_timeout_is_a_keyword_and_a_variable(monkeypatch):
    address = f"127.0.0.1:{free_port()}"
    what = described()
    error, seconds = fails(lambda: mz.plan(**what, server=address, connect_timeout=0.5))
    assert error.reason == "down" and 0.4 < seconds < 2.0, seconds
    monkeypatch.setenv("MATERIALIZER_CONNECT_TIMEOUT", "0.5")
    error, seconds = fails(lambda: stats_of(address))
    assert error.reason == "down" and 0.4 < seconds < 2.0, seconds
    # The default waits longer than that: a server may be starting.
    monkeypatch.delenv("MATERIALIZER_CONNECT_TIMEOUT")
    error, seconds = fails(lambda: stats_of(address))
    assert 2.5 < seconds < FAIL_WITHIN_S, seconds
    monkeypatch.setenv("MATERIALIZER_CONNECT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="MATERIALIZER_CONNECT_TIMEOUT must be a number"):
        mz.Client(address)


def test_a_server_that_comes_up_within_the_connect_timeout_is_waited_for():
    """Started two seconds after the call: the call waits and succeeds (a
    stand-in server that answers GetStats with an empty response)."""
    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[
        grpc.method_handlers_generic_handler("materializer.v1.Materializer", {
            "GetStats": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")})])
    server.add_insecure_port(f"127.0.0.1:{port}")
    starter = threading.Timer(2.0, server.start)
    starter.start()
    try:
        t0 = time.monotonic()
        with mz.Client(f"127.0.0.1:{port}", session=False, connect_timeout=10) as client:
            assert client.stats().handles == 0
        # Found about a second after it came up at the latest (attempts are
        # at most a second apart), not at the end of the connect timeout.
        assert 1.9 < time.monotonic() - t0 < 4.5
    finally:
        starter.join()
        server.stop(0)


def test_a_plaintext_client_of_a_tls_server(mtls):
    what = described()
    error, seconds = fails(lambda: mz.materialize(**what, server=mtls.address))
    print(f"plaintext client, TLS server: failed in {seconds:.2f} s")
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "tls_needed"
    text = str(error)
    assert text.startswith(f"materialize: cannot connect to {mtls.address} (UNAVAILABLE: "), text
    assert error.hint == ("the server closed the connection: if it uses TLS, give "
                          "tls=materializer.TLS(root_certificates=CA) (or MATERIALIZER_TLS_CA) "
                          "and an identity")
    assert "; hint: the server closed the connection: if it uses TLS" in text


def test_a_missing_client_certificate(pki, mtls):
    error, seconds = fails(lambda: mz.materialize(
        model(), server=mtls.address, tls=mz.TLS(root_certificates=pki.ca)))
    print(f"no client certificate, mTLS server: failed in {seconds:.2f} s")
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.code == grpc.StatusCode.UNAVAILABLE and error.reason == "cert_required"
    assert str(error).startswith(f"materialize: cannot connect to {mtls.address} ("), str(error)
    assert error.hint == (
        "the server closed the connection during the TLS handshake: it probably requires a "
        "client certificate (mTLS): give a client certificate (TLS(certificate_chain=..., "
        "private_key=...), or MATERIALIZER_TLS_CERT and MATERIALIZER_TLS_KEY)")


def test_a_tls_client_of_a_plaintext_server(pki, server):
    what = described()
    error, seconds = fails(lambda: mz.plan(**what, server=server.address,
                                           tls=mz.TLS(root_certificates=pki.ca)))
    print(f"TLS client, plaintext server: failed in {seconds:.2f} s")
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.reason == "not_tls", str(error)
    assert str(error).startswith(f"plan: cannot connect to {server.address} (UNAVAILABLE: ")
    assert error.hint == (
        "the server does not seem to speak TLS (a development-mode server?): leave out tls= "
        "and the MATERIALIZER_TLS, MATERIALIZER_TLS_CA, MATERIALIZER_TLS_CERT and "
        "MATERIALIZER_TLS_KEY variables")


def test_a_server_certificate_from_another_ca(pki, mtls):
    cert, key = pki.client("alice")
    what = described()
    error, seconds = fails(lambda: mz.plan(**what, server=mtls.address, tls=mz.TLS(
        root_certificates=pki.other_ca, certificate_chain=cert, private_key=key)))
    print(f"server certificate from another CA: failed in {seconds:.2f} s")
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.reason == "untrusted_server", str(error)
    assert error.hint == (
        f"the server's certificate was not trusted: it must chain to {pki.other_ca} "
        "(TLS(root_certificates=...)) and name the host in the address (or "
        "TLS(server_name=...))")


def test_a_wrong_token(pki, tokens, monkeypatch):
    tls = mz.TLS(root_certificates=pki.ca)
    what = described()
    error, seconds = fails(lambda: mz.materialize(**what, server=tokens.address, tls=tls,
                                                  token=WRONG_TOKEN))
    print(f"wrong token: failed in {seconds:.2f} s")
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED and error.reason == "token_refused"
    text = str(error)
    assert text.startswith(f"materialize: {tokens.address} refused the caller's identity "
                           "(UNAUTHENTICATED: "), text
    assert error.hint == ("the server did not accept the token from token=; check that it "
                          "is listed in the server's --token_file")
    assert WRONG_TOKEN not in text
    # From the environment, the hint names the variable.
    monkeypatch.setenv("MATERIALIZER_TLS_CA", str(pki.ca))
    monkeypatch.setenv("MATERIALIZER_TOKEN", WRONG_TOKEN)
    error, seconds = fails(lambda: mz.plan(**what, server=tokens.address))
    assert seconds < FAIL_WITHIN_S and str(error).startswith(f"plan: {tokens.address} refused")
    assert "did not accept the token from MATERIALIZER_TOKEN;" in error.hint
    # No token at all: the server wants an identity.
    monkeypatch.delenv("MATERIALIZER_TOKEN")
    error, _ = fails(lambda: mz.plan(model(), server=tokens.address))
    assert error.reason == "identity_needed"
    assert error.hint.startswith("the server wants an identity: a bearer token (token= ")


def test_a_client_certificate_without_the_token_the_server_wants(pki, mtls_and_tokens):
    cert, key = pki.client("alice")
    what = described()
    error, seconds = fails(lambda: mz.plan(**what, server=mtls_and_tokens.address, tls=mz.TLS(
        root_certificates=pki.ca, certificate_chain=cert, private_key=key)))
    assert seconds < AT_ONCE_S, (seconds, str(error))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED and error.reason == "token_needed"
    assert error.hint == (
        "the server took the client certificate but wants a bearer token on every call too: "
        "give token= (or MATERIALIZER_TOKEN, MATERIALIZER_TOKEN_FILE)")


def test_materialize_and_plan_take_tls_and_a_token(pki, tokens):
    tls = mz.TLS(root_certificates=pki.ca)
    planned = mz.plan(model(), server=tokens.address, tls=tls, token=TOKEN)
    assert planned.arena_bytes >= (8 * 16 + 16 + 16 * 4 + 4) * 4
    m = model()
    result = mz.materialize(m, server=tokens.address, tls=tls, token=TOKEN, transport="stream")
    assert result.bytes == (8 * 16 + 16 + 16 * 4 + 4) * 4
    assert all(not p.is_meta and torch.isfinite(p).all() for p in m.parameters())
    assert m[0].weight.abs().max() <= 1 / 8 ** 0.5  # kaiming_uniform(a=sqrt 5) bound
    with mz.Client(tokens.address, tls=tls, token=TOKEN) as c:
        with pytest.raises(ValueError, match="either client= or tls=, token="):
            mz.materialize(model(), client=c, tls=tls, token=TOKEN)


def test_the_environment_uses_matctls_names(pki, mtls_and_tokens, token_files, monkeypatch):
    cert, key = pki.client("alice")
    monkeypatch.setenv("MATERIALIZER_SERVER", mtls_and_tokens.address)
    monkeypatch.setenv("MATERIALIZER_TLS_CA", str(pki.ca))
    monkeypatch.setenv("MATERIALIZER_TLS_CERT", str(cert))
    monkeypatch.setenv("MATERIALIZER_TLS_KEY", str(key))
    monkeypatch.setenv("MATERIALIZER_TOKEN_FILE", str(token_files / "token"))
    with mz.Client() as c:
        assert c.address == mtls_and_tokens.address
        handle = c.materialize(model_proto()).handle
        assert c.describe(handle).owner == "trainer-t"  # the token's client wins
        c.release(handle)
    monkeypatch.setenv("MATERIALIZER_TOKEN", TOKEN)
    with pytest.raises(ValueError, match="both MATERIALIZER_TOKEN and MATERIALIZER_TOKEN_FILE"):
        mz.Client()
    monkeypatch.delenv("MATERIALIZER_TOKEN_FILE")
    with mz.Client(session=False) as c:
        assert c.stats().handles == 0
    # The SDK's old name for the server still works, with a warning.
    monkeypatch.delenv("MATERIALIZER_SERVER")
    monkeypatch.setenv("MATERIALIZER_ADDRESS", mtls_and_tokens.address)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = mz.Client(session=False)
    assert c.address == mtls_and_tokens.address
    deprecated = [w for w in caught if w.category is DeprecationWarning]
    assert [str(w.message) for w in deprecated] == [
        "MATERIALIZER_ADDRESS is deprecated: set MATERIALIZER_SERVER (the name matctl reads too)"]
    assert deprecated[0].filename == __file__  # it points at the caller
    c.close()
    # A token needs TLS, as in matctl.
    for key_ in ("MATERIALIZER_TLS_CA", "MATERIALIZER_TLS_CERT", "MATERIALIZER_TLS_KEY"):
        monkeypatch.delenv(key_)
    with pytest.raises(ValueError, match="the token from MATERIALIZER_TOKEN needs TLS"):
        mz.Client("127.0.0.1:1")


def model_proto():
    return mz.describe(model()).to_proto()


# -- the command line --------------------------------------------------------

def run_cli(*args, env=None, prelude=""):
    """`python -m materializer ARGS` (after `prelude`, Python run first in the
    same process) with only the MATERIALIZER_* variables of `env`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MATERIALIZER_") or k == "MATERIALIZER_PY_PROTO"}
    base["MATERIALIZER_PY_PROTO"] = serverproc.PY_PROTO
    base["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, base.get("PYTHONPATH", "")])
    base.update(env or {})
    code = (f"{prelude}\nimport runpy, sys\nsys.argv = ['materializer', *{list(args)!r}]\n"
            "runpy.run_module('materializer', run_name='__main__', alter_sys=True)\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=base, timeout=120)
    done.seconds = time.monotonic() - t0
    return done


@pytest.fixture(scope="module")
def request_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("request") / "tiny.json"
    path.write_text(json.dumps({"model": {
        "tensors": [{"name": "w", "shape": [1024], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}))
    return str(path)


def test_cli_plan_against_mtls_and_tokens(pki, mtls_and_tokens, token_files, request_file):
    cert, key = pki.client("alice")
    done = run_cli("plan", request_file, "--server", mtls_and_tokens.address,
                   "--tls-ca", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key),
                   "--token-file", str(token_files / "token"))
    assert done.returncode == 0, done.stderr
    assert "tensors: 1 (1 names" in done.stdout
    assert "server plan: arena 4,096 bytes" in done.stdout, done.stdout
    assert "cpu" in done.stdout.split("server plan:")[1]
    assert done.stderr == ""
    # The token from MATERIALIZER_TOKEN, the rest from options.
    done = run_cli("plan", request_file, "--server", mtls_and_tokens.address, "--json",
                   "--tls-ca", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key),
                   env={"MATERIALIZER_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["arena_bytes"] == 4096


def test_cli_token_as_an_argument_is_deprecated(pki, tokens, request_file):
    done = run_cli("plan", request_file, "--server", tokens.address, "--tls-ca", str(pki.ca),
                   "--token", TOKEN)
    assert done.returncode == 0, done.stderr
    assert "server plan: arena 4,096 bytes" in done.stdout
    assert done.stderr == ("python -m materializer plan: warning: --token is deprecated (a "
                           "token on the command line shows in process listings): use "
                           "--token-file or MATERIALIZER_TOKEN\n")
    assert "--token " not in run_cli("plan", "--help").stdout


TIMED_PLAN = """
import time, materializer.client.client as client_module
untimed = client_module.Client.plan
def timed(self, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return untimed(self, *args, **kwargs)
    finally:
        with open({path!r}, "w") as f:
            f.write(str(time.monotonic() - t0))
client_module.Client.plan = timed
"""


def test_cli_connection_errors_are_one_line(pki, tokens, mtls, token_files, request_file,
                                            tmp_path):
    down = f"127.0.0.1:{free_port()}"
    wrong = token_files / "wrong"
    wrong.write_text(WRONG_TOKEN + "\n")
    cases = [
        ([down], "cannot connect to " + down,
         f"hint: no server answered at {down}. Is materializerd running there? `./dev serve` "
         "starts one on 127.0.0.1:50051; --server points it elsewhere"),
        ([mtls.address], "cannot connect to " + mtls.address,
         "hint: the server closed the connection: if it uses TLS, give --tls-ca (or --tls) "
         "and an identity"),
        ([mtls.address, "--tls-ca", str(pki.ca)], "cannot connect to " + mtls.address,
         "hint: the server closed the connection during the TLS handshake: it probably "
         "requires a client certificate (mTLS): give a client certificate (--tls-cert and "
         "--tls-key)"),
        ([tokens.address, "--tls-ca", str(pki.ca), "--token-file", str(wrong)],
         f"{tokens.address} refused the caller's identity (UNAUTHENTICATED",
         f"hint: the server did not accept the token from --token-file={wrong}; check that "
         "it is listed in the server's --token_file"),
    ]
    timing = tmp_path / "plan-seconds"
    for server_args, what, hint in cases:
        done = run_cli("plan", request_file, "--server", *server_args,
                       prelude=TIMED_PLAN.format(path=str(timing)))
        seconds = float(timing.read_text())  # the Plan call, without start-up
        print(f"{' '.join(server_args[1:2]) or 'plaintext'} -> {what}: exit "
              f"{done.returncode}, the call failed in {seconds:.2f} s")
        assert done.returncode == 1, done.stdout
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"python -m materializer plan: {what}"), lines[0]
        assert lines[0].endswith(hint), lines[0]
        assert seconds < FAIL_WITHIN_S


HF_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 4, "vocab_size": 512}
NO_TRANSFORMERS = "import sys; sys.modules['transformers'] = None  # as if not installed"


def test_cli_hf_config_without_transformers(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    done = run_cli("plan", str(folder / "config.json"), prelude=NO_TRANSFORMERS)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "python -m materializer plan: a Hugging Face config needs transformers, which is not "
        'installed: pip install "./python[hf]" (from a checkout of materializer), or pip '
        "install transformers\n")
    # With it, the same command prints the estimate.
    done = run_cli("plan", str(folder))
    assert done.returncode == 0, done.stderr
    assert "parameters:" in done.stdout


def test_hf_without_transformers_is_an_import_error_naming_the_extra(monkeypatch):
    from materializer import hf
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r'needs transformers.*pip install "\./python\[hf\]"'):
        hf.from_config(object())
