"""materializer.Client options against TLS servers: server-verified TLS
with a bearer token, mTLS with a client certificate; the identity is the
token's or the certificate's, sessions work over TLS; and the estimate
command (python -m materializer plan) with a server's Plan."""

import json
import os
import subprocess
import sys

import grpc
import pytest
import torch

import materializer as mz
import serverproc
from test_auth import pki  # noqa: F401 - the certificates fixture

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def model():
    with mz.meta_device():
        return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))


def test_token_over_tls(pki, tmp_path):  # noqa: F811
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-0123456789abcdef trainer-a\n")
    with serverproc.running_server([f"--tls_cert={pki / 'server.pem'}",
                                    f"--tls_key={pki / 'server.key'}",
                                    f"--token_file={tokens}"], connect=False) as srv:
        port = srv.address.rsplit(":", 1)[1]
        tls = mz.TLS(root_certificates=pki / "ca.pem")
        with mz.Client(f"localhost:{port}", tls=tls, token="tok-0123456789abcdef") as c:
            m = model()
            r = mz.materialize(m, client=c, keep_handle=True)
            info = c.describe(r.handle)
            assert info.owner == "trainer-a" and info.session == c.session().id
            assert torch.equal(m[1].weight, torch.ones(8))
            c.release(r.handle)
        with mz.Client(f"localhost:{port}", tls=tls, token="tok-not-a-token-at-all",
                       session=False) as c:
            with pytest.raises(mz.RpcError) as e:
                c.stats()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_mtls_client_certificate(pki):  # noqa: F811
    with serverproc.running_server([f"--tls_cert={pki / 'server.pem'}",
                                    f"--tls_key={pki / 'server.key'}",
                                    f"--tls_client_ca={pki / 'ca.pem'}"], connect=False) as srv:
        port = srv.address.rsplit(":", 1)[1]
        tls = mz.TLS(root_certificates=pki / "ca.pem", certificate_chain=pki / "alice.pem",
                     private_key=pki / "alice.key")
        with mz.Client(f"127.0.0.1:{port}", tls=tls) as c:
            m = model()
            r = mz.materialize(m, client=c, transport="stream", keep_handle=True)
            assert c.describe(r.handle).owner == "alice"
            c.release(r.handle)
            assert [x.client for x in c.stats().clients] in ([], ["alice"])


def test_option_mistakes_are_caught_before_connecting():
    with pytest.raises(ValueError, match="needs TLS"):
        mz.Client("127.0.0.1:1", token="tok-0123456789abcdef")
    with pytest.raises(ValueError, match="go together"):
        mz.TLS(certificate_chain=b"x")
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"part_bytes must be >= 0 \(0: one handle\), not -1"):
        mz.materialize(model, server="127.0.0.1:1", part_bytes=-1)
    assert model.weight.is_meta


def run_plan(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run([sys.executable, "-m", "materializer", "plan", *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plan_command_on_a_request_file_a_config_and_a_server(server, tmp_path):
    got = json.loads(run_plan(os.path.join(REPO, "examples", "gpt2-small.json"), "--json"))
    # examples/gpt2-small.json: 124,439,808 float32 parameters, lm_head tied.
    assert got["parameters"] == 124_439_808
    assert got["total_bytes"] == 124_439_808 * 4
    assert got["largest_tensor"] == {"name": "transformer.wte.weight", "bytes": 50257 * 768 * 4}
    assert got["training_adam_bytes"] == 4 * got["total_bytes"] + 4 * got["tensors"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100}))
    got = json.loads(run_plan(str(config), "--json", "--server", server.address))
    per_layer = 64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 64 * 2
    params = 100 * 64 * 2 + 2 * per_layer + 64
    assert got["parameters"] == params
    # Two rotary buffers (inv_freq, original_inv_freq), float32, 8 each.
    assert got["total_bytes"] == params * 4 + 2 * 8 * 4
    plan = got["plan"]
    assert plan["placement"] == "cpu" and plan["devices"][0]["fits"]
    assert plan["arena_bytes"] >= got["total_bytes"]
    text = run_plan(str(config))
    assert "training with Adam" in text and "float32" in text
    server.assert_idle()


def test_plan_reads_a_config_as_transformers_does(tmp_path):
    """A config.json with an infinite float, as save_pretrained writes it
    ({"__float__": "Infinity"}, GraniteMoeHybrid's time_step_limit): plan
    builds the model from it (it failed the config's validation when built
    from the parsed JSON)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GraniteMoeHybridConfig(
        hidden_size=64, intermediate_size=128, shared_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        num_local_experts=2, num_experts_per_tok=1, mamba_n_heads=4, mamba_d_head=32,
        mamba_d_state=16, layer_types=["mamba", "attention"])
    assert config.time_step_limit[1] == float("inf")
    config.save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    with torch.device("meta"):
        want = transformers.GraniteMoeHybridModel(config)
    got = json.loads(run_plan(str(tmp_path), "--json"))
    assert got["parameters"] == sum(p.numel() for p in want.parameters())


class Proxy:
    """A TCP proxy to `target` whose connections can be cut (a network
    blip) while it keeps listening."""

    def __init__(self, target):
        import socket
        import threading
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.socks = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(self.target)
            with self.lock:
                self.socks += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(x, y):
        try:
            while True:
                data = x.recv(1 << 16)
                if not data:
                    break
                y.sendall(data)
        except OSError:
            pass
        for s in (x, y):
            try:
                s.close()
            except OSError:
                pass

    def cut(self):
        import socket
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.listener.close()
        self.cut()


def test_a_broken_session_stream_is_resumed_and_keeps_the_handles(tmp_path):
    import time
    with serverproc.running_server(["--session_grace=2s"]) as srv:
        proxy = Proxy(srv.address)
        client = mz.Client(proxy.address)
        try:
            m = model()
            r = mz.materialize(m, client=client, keep_handle=True, transport="stream")
            session = client.session().id
            proxy.cut()                         # the Attach stream breaks
            time.sleep(3.5)                     # longer than the grace period
            info = client.describe(r.handle)    # a new connection, same session
            assert info.session == session and client.session().lost is None
            assert srv.stats().handles == 1
        finally:
            client.close()
            proxy.close()
        deadline = time.monotonic() + 10
        while srv.stats().handles and time.monotonic() < deadline:
            time.sleep(0.1)
        srv.assert_idle()
