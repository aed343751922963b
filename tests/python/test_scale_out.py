"""Scale-out: several materializerd replicas on loopback ports stand in for
the pods behind a headless Service, and matctl is given all their
addresses. Materialize lands on the replica with the most free memory,
every call naming a handle goes to the replica its id names, ls merges
them, and when a replica goes away its handles answer clearly while the
others keep serving (docs/architecture.md, "Scale-out")."""

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time

import grpc
import pytest

import certs
import serverproc
from test_matctl_identity import matctl

MiB = 1 << 20
CLIENT = "scale-out-test"
EXIT_NOT_FOUND, EXIT_UNAVAILABLE = 3, 6


class Replica:
    """One materializerd process, its address and a stub to it."""

    def __init__(self, name, proc, address, log_path, pb, pb_grpc):
        self.name = name
        self.proc = proc
        self.address = address
        self.log_path = log_path
        self.pb = pb
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.MaterializerStub(self.channel)

    def handles(self):
        md = ((serverproc.CLIENT_KEY, CLIENT),)
        return [h.handle for h in self.stub.ListHandles(
            self.pb.ListHandlesRequest(), metadata=md, timeout=30).handles]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def start(name, capacity, extra=()):
    pb, pb_grpc = serverproc.import_protos()
    log = tempfile.NamedTemporaryFile(prefix=f"materializerd-{name}-",
                                      suffix=".log", delete=False)
    cmd = [serverproc.SERVER_BIN, "--listen=127.0.0.1:0", "--devices=cpu",
           f"--cpu_capacity={capacity}", "--log_level=warning",
           f"--replica={name}", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log,
                            stdin=subprocess.DEVNULL)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout],
                     daemon=True).start()
    try:
        line = lines.get(timeout=serverproc.STARTUP_TIMEOUT_S).decode()
    except queue.Empty:
        proc.kill()
        pytest.fail(f"{name} did not start: {open(log.name).read()}")
    m = serverproc.LISTEN_RE.match(line)
    assert m, (line, open(log.name).read())
    return Replica(name, proc, m.group(1), log.name, pb, pb_grpc)


@contextlib.contextmanager
def replicas(spec, extra=()):
    """Replicas [(name, capacity)], all stopped on exit (killed ones too)."""
    started = []
    try:
        for name, capacity in spec:
            started.append(start(name, capacity, extra))
        yield started
    finally:
        for r in started:
            r.channel.close()
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                try:
                    r.proc.wait(timeout=serverproc.SHUTDOWN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait()
            os.unlink(r.log_path)


def model(tmp_path, mib, name):
    """A model of `mib` MiB of zeros (cheap to initialize)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"exportable": True, "model": {
        "tensors": [{"name": f"{name}.weight", "shape": [mib, 256 * 1024],
                     "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"zeros": {}}}]}}))
    return str(path)


def target(rs):
    return ",".join(r.address for r in rs)


def ctl(rs, *args, extra=()):
    return matctl(f"--server={target(rs)}", f"--client={CLIENT}", *extra,
                  *args)


def materialize(rs, path):
    r = ctl(rs, "--output=json", "materialize", path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["handle"]


def test_three_replicas_route_by_room_and_by_id(tmp_path):
    with replicas([("r0", "64MiB"), ("r1", "96MiB"), ("r2", "80MiB")]) as rs:
        r0, r1, r2 = rs
        # Each Materialize asks every replica for its free memory first.
        a = materialize(rs, model(tmp_path, 40, "a"))  # 96 free on r1
        b = materialize(rs, model(tmp_path, 40, "b"))  # 80 free on r2
        c = materialize(rs, model(tmp_path, 40, "c"))  # 64 free on r0
        assert (a.split("@")[1], b.split("@")[1], c.split("@")[1]) == \
            ("r1", "r2", "r0")
        assert r1.handles() == [a] and r2.handles() == [b] and \
            r0.handles() == [c]

        # Every call naming a handle reaches the replica that holds it (any
        # other would answer NOT_FOUND).
        for h in (a, b, c):
            for args in (("describe", h), ("renew", h),
                         ("fetch", h, "-o", str(tmp_path / "w.st"))):
                r = ctl(rs, *args)
                assert r.returncode == 0, (args, r.stderr)
            exported = ctl(rs, "--output=json", "export", h)
            assert exported.returncode == 0, exported.stderr
            export_id = json.loads(exported.stdout)["exportId"]
            assert export_id.endswith("@" + h.split("@")[1])
            closed = ctl(rs, "close-export", export_id)
            assert closed.returncode == 0, closed.stderr

        listed = ctl(rs, "--output=json", "ls")
        assert listed.returncode == 0, listed.stderr
        assert sorted(x["handle"] for x in json.loads(listed.stdout)["handles"]) \
            == sorted([a, b, c])

        found = json.loads(ctl(rs, "--output=json", "replicas").stdout)
        assert [e["info"]["replica"] for e in found["replicas"]] == \
            ["r0", "r1", "r2"]
        stats = json.loads(ctl(rs, "--output=json", "stats").stdout)
        assert [e["replica"] for e in stats["replicas"]] == ["r0", "r1", "r2"]
        assert [e["stats"]["handles"] for e in stats["replicas"]] == [1, 1, 1]

        for h, holder in ((a, r1), (b, r2), (c, r0)):
            r = ctl(rs, "release", h)
            assert r.returncode == 0, r.stderr
            assert holder.handles() == []


def test_a_replica_going_away(tmp_path):
    with replicas([("r0", "64MiB"), ("r1", "96MiB"), ("r2", "80MiB")]) as rs:
        r0, r1, r2 = rs
        on_r1 = materialize(rs, model(tmp_path, 40, "a"))
        on_r2 = materialize(rs, model(tmp_path, 40, "b"))
        assert on_r1.endswith("@r1") and on_r2.endswith("@r2")
        r2.kill()

        # Its handles: UNAVAILABLE (its address is still listed, so it may
        # come back), naming the replica.
        gone = ctl(rs, "--timeout=10s", "describe", on_r2)
        assert gone.returncode == EXIT_UNAVAILABLE, gone.stderr
        assert "held by replica r2" in gone.stderr
        assert f"{r2.address} did not answer" in gone.stderr
        assert "hint: one replica is not answering" in gone.stderr
        fetch = ctl(rs, "--timeout=10s", "fetch", on_r2, "-o",
                    str(tmp_path / "x.st"))
        assert fetch.returncode == EXIT_UNAVAILABLE, fetch.stderr

        # Commands that ask every replica print what the others said, and
        # their hint names the one that did not answer (not every address).
        for args in (("stats",), ("health",), ("replicas",), ("ls",)):
            r = ctl(rs, "--timeout=10s", *args)
            assert r.returncode == EXIT_UNAVAILABLE, (args, r.stderr)
            hints = [line for line in r.stderr.splitlines()
                     if line.startswith("hint: ")]
            assert len(hints) == 1, (args, r.stderr)
            assert hints[0].startswith(
                f"hint: the server at {r2.address} did not answer, while "
                "the other replicas did"), (args, hints)
            assert r0.address not in hints[0] and \
                r1.address not in hints[0], (args, hints)
            assert "no server answered" not in r.stderr, (args, r.stderr)

        # The others keep serving.
        assert ctl(rs, "describe", on_r1).returncode == 0
        again = materialize(rs, model(tmp_path, 8, "c"))
        assert not again.endswith("@r2")
        listed = ctl(rs, "--output=json", "ls")
        assert listed.returncode == EXIT_UNAVAILABLE, listed.stderr
        assert sorted(x["handle"] for x in json.loads(listed.stdout)["handles"]) \
            == sorted([on_r1, again])
        assert f"({r2.address}) is missing from the list" in listed.stderr or \
            f"{r2.address} is missing from the list" in listed.stderr
        health = ctl(rs, "health")
        assert health.returncode == EXIT_UNAVAILABLE
        assert "UNREACHABLE" in health.stdout and health.stdout.count(
            "SERVING") == 2

        # Once its address is gone from the Service too, the replica is
        # known to be gone: NOT_FOUND.
        known = ctl([r0, r1], "describe", on_r2)
        assert known.returncode == EXIT_NOT_FOUND, known.stderr
        assert "held by replica r2" in known.stderr and \
            "has gone away" in known.stderr

        for h in (on_r1, again):
            assert ctl(rs, "release", h).returncode == 0


def test_an_id_sent_to_another_replica_names_its_replica(tmp_path):
    with replicas([("ra", "64MiB"), ("rb", "96MiB")]) as rs:
        ra, rb = rs
        on_rb = materialize(rs, model(tmp_path, 8, "a"))
        assert on_rb.endswith("@rb")
        # Only ra's address: the id says rb holds it, and where to go.
        wrong = ctl([ra], "describe", on_rb)
        assert wrong.returncode == EXIT_NOT_FOUND, wrong.stderr
        assert (f'"{on_rb}" names replica rb, but {ra.address} is replica '
                "ra") in wrong.stderr, wrong.stderr
        assert "connect to rb's address, or give every replica's address" \
            in wrong.stderr
        # ra's own id that it no longer holds: a plain NOT_FOUND.
        on_ra = materialize([ra], model(tmp_path, 8, "b"))
        assert ctl([ra], "release", on_ra).returncode == 0
        gone = ctl([ra], "describe", on_ra)
        assert gone.returncode == EXIT_NOT_FOUND, gone.stderr
        assert "names replica" not in gone.stderr
        assert ctl([rb], "describe", on_rb).returncode == 0
        assert ctl(rs, "release", on_rb).returncode == 0


def test_two_tls_replicas_with_a_token_and_advertised_addresses(tmp_path):
    pki = certs.make_pki(tmp_path)
    tokens = tmp_path / "tokens.txt"
    token = "tok-scale-out-0123456789abcdef"
    tokens.write_text(f"{token} trainer\n")
    ports = []
    for _ in range(2):
        with contextlib.closing(__import__("socket").socket()) as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    tls = [f"--tls_cert={pki.server_cert}", f"--tls_key={pki.server_key}",
           f"--token_file={tokens}"]
    rs = []
    with contextlib.ExitStack() as stack:
        for name, port, capacity in (("r0", ports[0], "64MiB"),
                                     ("r1", ports[1], "96MiB")):
            # A fixed port, so the replica can advertise it.
            [r] = stack.enter_context(replicas(
                [(name, capacity)],
                extra=[*tls, f"--listen=127.0.0.1:{port}",
                       f"--advertise=127.0.0.1:{port}"]))
            rs.append(r)
        env = {"MATERIALIZER_TOKEN": token}
        base = [f"--server={target(rs)}", f"--tls_ca={pki.ca}"]
        made = matctl(*base, "--output=json", "materialize",
                      model(tmp_path, 16, "t"), env=env)
        assert made.returncode == 0, made.stderr
        h = json.loads(made.stdout)["handle"]
        assert h.endswith("@r1")
        info = matctl(*base, "--output=json", "describe", h, env=env)
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["owner"] == "trainer"
        found = json.loads(matctl(*base, "--output=json", "replicas",
                                  env=env).stdout)
        assert [e["info"]["advertisedAddress"] for e in found["replicas"]] == \
            [f"127.0.0.1:{p}" for p in ports]
        # Without the token every replica refuses, and nothing is created.
        refused = matctl(*base, "materialize", model(tmp_path, 1, "u"))
        assert refused.returncode == 4, refused.stderr
        assert "UNAUTHENTICATED" in refused.stderr
        assert matctl(*base, "release", h, env=env).returncode == 0
