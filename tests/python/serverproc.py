"""Starting materializerd for tests, and a small client around its stub.

Builds nothing. Needs
  MATERIALIZERD          server binary (default <repo>/bazel-bin/server/materializerd)
  MATERIALIZER_PY_PROTO  generated Python code (default <repo>/bazel-bin/proto)
Both come from `./dev test` (or `bazel build //server:materializerd
//proto:materializer_py`).
"""

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_BIN = os.environ.get(
    "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd"))
PY_PROTO = os.environ.get(
    "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto"))

STARTUP_TIMEOUT_S = 120
SHUTDOWN_TIMEOUT_S = 30
CLIENT_KEY = "x-materializer-client"
SESSION_KEY = "x-materializer-session"
LISTEN_RE = re.compile(r"^materializerd listening on (\S+)\s*$")


def import_protos():
    pb2 = os.path.join(PY_PROTO, "materializer", "v1", "materializer_pb2.py")
    if not os.path.exists(pb2):
        pytest.fail(
            f"generated Python protos not found at {pb2} "
            "(set MATERIALIZER_PY_PROTO, or run `./dev test`, which builds "
            "//proto:materializer_py)", pytrace=False)
    if PY_PROTO not in sys.path:
        sys.path.insert(0, PY_PROTO)
    from materializer.v1 import materializer_pb2, materializer_pb2_grpc
    return materializer_pb2, materializer_pb2_grpc


class Server:
    """A running materializerd plus a channel, a stub and small helpers."""

    class Offline:
        """Address and process only (no insecure channel)."""

        def __init__(self, address):
            self.address = address
            self.channel = None

    def __init__(self, address, pb, pb_grpc):
        import grpc
        from google.protobuf import json_format
        self.grpc = grpc
        self.json_format = json_format
        self.pb = pb
        self.address = address
        # gRPC's default message limits on purpose: the largest fetch chunk
        # must fit them.
        self.channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb_grpc.MaterializerStub(self.channel)

    # -- identity -----------------------------------------------------------
    @staticmethod
    def md(client):
        return None if client is None else ((CLIENT_KEY, client),)

    # -- requests -----------------------------------------------------------
    def parse_request(self, text, cls=None):
        cls = cls or self.pb.MaterializeRequest
        return self.json_format.Parse(text, cls())

    def example(self, name):
        with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
            return self.parse_request(f.read())

    def materialize(self, req, client=None, timeout=300):
        return self.stub.Materialize(req, metadata=self.md(client),
                                     timeout=timeout)

    def release(self, handle, client=None):
        return self.stub.Release(self.pb.ReleaseRequest(handle=handle),
                                 metadata=self.md(client), timeout=60)

    def describe(self, handle, client=None):
        return self.stub.Describe(self.pb.DescribeRequest(handle=handle),
                                  metadata=self.md(client), timeout=60)

    def stats(self, client=None):
        return self.stub.GetStats(self.pb.GetStatsRequest(),
                                  metadata=self.md(client), timeout=60)

    def fetch_chunks(self, handle, client=None, **kw):
        """Every WeightChunk of one FetchWeights call, as a list."""
        req = self.pb.FetchRequest(handle=handle, **kw)
        return list(self.stub.FetchWeights(req, metadata=self.md(client),
                                           timeout=300))

    def fetch(self, handle, client=None, **kw):
        """The fetched bytes (from `offset`), checking the chunk framing."""
        offset = kw.get("offset", 0)
        chunks = self.fetch_chunks(handle, client, **kw)
        assert chunks, "FetchWeights sent no chunk"
        total = chunks[0].total_bytes
        pos = offset
        parts = []
        for c in chunks:
            assert c.offset == pos, (c.offset, pos)
            assert c.total_bytes == total
            parts.append(c.data)
            pos += len(c.data)
        assert pos == total, f"stream ended at {pos}, file is {total} bytes"
        return b"".join(parts)

    @contextlib.contextmanager
    def handle(self, req, client=None):
        """Materializes `req` and releases it on exit."""
        resp = self.materialize(req, client)
        try:
            yield resp
        finally:
            self.release(resp.handle, client)

    def attach(self, client=None, resume_token="", channel=None):
        """Opens (or resumes) a session; returns an Attachment."""
        return Attachment(self, client, resume_token, channel or self.channel)

    def session_md(self, client, session_id):
        md = [(SESSION_KEY, session_id)]
        if client is not None:
            md.append((CLIENT_KEY, client))
        return tuple(md)

    def client_usage(self, client):
        """(reserved + in-use bytes, handles) the server counts for `client`."""
        for c in self.stats(client).clients:
            if c.client == (client or "anonymous"):
                return c.reserved_bytes + c.in_use_bytes, c.handles
        return 0, 0

    def assert_idle(self, client=None):
        """Nothing reserved, in use or registered anywhere."""
        s = self.stats(client)
        assert s.reserved_bytes == 0, s
        assert s.in_use_bytes == 0, s
        assert s.handles == 0, s
        assert s.devices, s
        for d in s.devices:
            assert d.reserved_bytes == 0, d
            assert d.in_use_bytes == 0, d
            assert d.handles == 0, d
        for c in s.clients:
            assert c.reserved_bytes == 0 and c.in_use_bytes == 0, c
            assert c.handles == 0, c
        return s


class Attachment:
    """One Attach stream: the session lease. close() ends it cleanly (the
    client half-closes); crash() cancels it abruptly, as a dying client
    would."""

    def __init__(self, server, client, resume_token, channel):
        import grpc
        self._done = threading.Event()
        pb = server.pb
        stub = server.stub if channel is server.channel else \
            server.stub.__class__(channel)

        def requests():
            yield pb.AttachRequest(resume_token=resume_token)
            self._done.wait()

        self._call = stub.Attach(requests(), metadata=server.md(client))
        try:
            first = next(self._call)
        except grpc.RpcError:
            self._done.set()
            raise
        self.session_id = first.session_id
        self.resume_token = first.resume_token
        self.resumed = first.resumed
        self.grace_s = first.grace.seconds + first.grace.nanos / 1e9

    def close(self):
        self._done.set()
        for _ in self._call:  # drain until the server finishes the stream
            pass

    def crash(self):
        self._call.cancel()
        self._done.set()


def _reader(stream, q):
    for line in iter(stream.readline, b""):
        q.put(line.decode("utf-8", "replace"))
    q.put(None)


def _tail(path, n=40):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def running_server(extra_args=(), cpu_capacity="8GiB", devices="cpu",
                   log_level="warning", connect=True, shm_pool="0",
                   binary=None):
    """A materializerd on 127.0.0.1:0 with `extra_args`, as a Server; stopped
    (SIGTERM, checked clean exit) on leaving the block. With connect=False
    (a TLS server) the Server carries only the address and process.

    `shm_pool` is its --shm_pool_bytes: "0" by default, so that a test sees
    only the shared memory its own handles hold (the adaptive pool would
    refill /dev/shm a second after each export); None leaves the binary's
    default ("auto"), for the tests of that default. `binary` runs another
    build than MATERIALIZERD's (a benchmark's baseline)."""
    pb, pb_grpc = import_protos()
    binary = binary or SERVER_BIN
    if not os.path.exists(binary):
        pytest.fail(
            f"server binary not found at {binary}: run `./dev test` "
            "(it builds //server:materializerd first), or set MATERIALIZERD",
            pytrace=False)

    log = tempfile.NamedTemporaryFile(prefix="materializerd-", suffix=".log",
                                      delete=False)
    cmd = [binary, "--listen=127.0.0.1:0", f"--devices={devices}",
           f"--cpu_capacity={cpu_capacity}", f"--log_level={log_level}",
           *extra_args]
    if shm_pool is not None and not any(
            a.startswith("--shm_pool_bytes") for a in extra_args):
        cmd.append(f"--shm_pool_bytes={shm_pool}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log,
                            stdin=subprocess.DEVNULL)
    lines = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines),
                     daemon=True).start()

    address = None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    stdout_seen = []
    while address is None:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            pytest.fail(f"{' '.join(cmd)}: no 'listening' line within "
                        f"{STARTUP_TIMEOUT_S} s; stderr:\n{_tail(log.name)}",
                        pytrace=False)
        if line is None:
            rc = proc.wait()
            pytest.fail(f"{' '.join(cmd)} exited with {rc} before listening; "
                        f"stdout: {stdout_seen!r}\nstderr:\n{_tail(log.name)}",
                        pytrace=False)
        stdout_seen.append(line)
        m = LISTEN_RE.match(line)
        if m:
            address = m.group(1)

    srv = Server(address, pb, pb_grpc) if connect else Server.Offline(address)
    srv.proc = proc
    srv.log_path = log.name
    try:
        yield srv
    finally:
        if srv.channel is not None:
            srv.channel.close()
        crashed = proc.poll()
        if crashed is None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"materializerd did not exit within "
                            f"{SHUTDOWN_TIMEOUT_S} s of SIGTERM; stderr:\n"
                            f"{_tail(log.name)}", pytrace=False)
            if rc != 0:
                pytest.fail(f"materializerd exited with {rc} on SIGTERM; "
                            f"stderr:\n{_tail(log.name)}", pytrace=False)
        else:
            pytest.fail(f"materializerd died during the tests (rc {crashed}); "
                        f"stderr:\n{_tail(log.name)}", pytrace=False)
        extra = []
        while True:  # drain stdout up to EOF (the reader thread's None)
            try:
                line = lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            extra.append(line)
        # The contract is exactly one stdout line.
        assert not extra, f"unexpected stdout from materializerd: {extra!r}"
        os.unlink(log.name)


# -- for the hostile-client tests (test_hardening_*) ---------------------------

SERVICE_PATH = "/materializer.v1.Materializer/"


def rss_bytes(pid):
    """Resident set size of process `pid`, in bytes (Linux)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid):
    """User + system CPU time process `pid` has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def raw_unary(channel, method, payload, metadata=None, timeout=30):
    """Sends `payload` (bytes, not necessarily a valid message) to the unary
    RPC `method` of the Materializer service and returns the answer's
    bytes."""
    call = channel.unary_unary(SERVICE_PATH + method,
                               request_serializer=None,
                               response_deserializer=None)
    return call(payload, metadata=metadata, timeout=timeout)


def raw_unary_future(channel, method, payload, metadata=None, timeout=30):
    call = channel.unary_unary(SERVICE_PATH + method,
                               request_serializer=None,
                               response_deserializer=None)
    return call.future(payload, metadata=metadata, timeout=timeout)


def health_serving(channel, timeout=2.0):
    """True if grpc.health.v1.Health/Check for "" answers SERVING within
    `timeout` seconds; False on any error (the reason is not needed)."""
    import grpc
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=None,
                                response_deserializer=None)
    try:
        # HealthCheckRequest{service: ""} is empty; SERVING is status = 1.
        return check(b"", timeout=timeout) == b"\x08\x01"
    except grpc.RpcError:
        return False


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def plan_request_bytes(tensors, rules=(("*", b"\x0a\x00"),), tie_chain=False):
    """A serialized PlanRequest of `tensors` (name, [dims]) float32 tensors,
    built directly as bytes so that requests of 10^5..10^6 tensors take
    milliseconds to build in Python. `rules` are (pattern, serialized
    InitScheme) pairs (default: "*" -> zeros). With tie_chain, tensor i is
    tied to tensor i + 1 (a chain ending at the last)."""
    parts = []
    dtype = _field(3, b"float32")
    for i, (name, dims) in enumerate(tensors):
        body = _field(1, name.encode()) + _field(
            2, b"".join(_varint(d) for d in dims)) + dtype
        if tie_chain and i + 1 < len(tensors):
            body += _field(8, tensors[i + 1][0].encode())
        parts.append(_field(1, body))
    for pattern, scheme in rules:
        rule = _field(1, pattern.encode() if isinstance(pattern, str)
                      else pattern) + _field(2, scheme)
        parts.append(_field(2, rule))
    return _field(1, b"".join(parts))


def make_tls_pki(directory):
    """Writes a CA (ca.pem) and a server certificate for 127.0.0.1 and
    localhost (server.pem, server.key) into `directory`, with openssl."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem")
    with open(os.path.join(directory, "server.ext"), "w",
              encoding="ascii") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server",
            "-keyout", "server.key", "-out", "server.csr")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
            "ca.key", "-CAcreateserial", "-days", "2", "-extfile",
            "server.ext", "-out", "server.pem")
