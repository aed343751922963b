"""Sessions and leases: a client that goes away, however it goes away,
leaves nothing behind once the grace period has passed; a client that comes
back in time keeps its handles; unused handles outside a session lapse."""

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

import serverproc

GRACE_S = 1.0
HERE = os.path.dirname(os.path.abspath(__file__))


def small_model(pb, nbytes=1 << 20, name="w"):
    return pb.ModelSpec(
        tensors=[pb.TensorSpec(name=name, shape=[nbytes // 4], dtype="float32")],
        init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
            zeros=pb.Zeros()))])


@pytest.fixture(scope="module")
def srv():
    with serverproc.running_server([f"--session_grace={GRACE_S}s",
                                    "--log_level=info"]) as s:
        yield s


def spawn(srv, client, *args):
    env = dict(os.environ, MATERIALIZER_PY_PROTO=serverproc.PY_PROTO)
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "session_client.py"), srv.address,
         client, *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def wait_line(proc, prefix, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.split()
        if not line and proc.poll() is not None:
            raise AssertionError(f"client exited: {proc.stderr.read()}")
    raise AssertionError(f"no {prefix!r} line within {timeout} s")


def seconds_until_idle(srv, client, limit=30.0):
    """Polls the ledger every 10 ms; seconds until `client` holds nothing."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if srv.client_usage(client) == (0, 0):
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"{client} still holds {srv.client_usage(client)} "
                         f"after {limit} s")


def test_sigkill_frees_everything_within_grace(srv):
    proc = spawn(srv, "victim-hold", "hold", 3, 8 << 20)
    handles = wait_line(proc, "ready")[1:]
    assert len(handles) == 3
    held, count = srv.client_usage("victim-hold")
    assert count == 3 and held >= 3 * (8 << 20)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    elapsed = seconds_until_idle(srv, "victim-hold")
    print(f"\nSIGKILL -> ledger zero in {elapsed:.3f} s (grace {GRACE_S} s)")
    assert GRACE_S * 0.9 <= elapsed <= GRACE_S + 1.0
    for h in handles:
        with pytest.raises(grpc.RpcError) as e:
            srv.describe(h, client="victim-hold")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    srv.assert_idle(client="victim-hold")


def test_kill_mid_materialize_rolls_back(srv):
    # ~1 GiB of normal(): seconds of init, so the kill lands mid-call.
    proc = spawn(srv, "victim-mat", "materialize", 1 << 30)
    wait_line(proc, "calling")
    deadline = time.monotonic() + 60
    while srv.client_usage("victim-mat")[0] == 0:
        assert time.monotonic() < deadline, "the materialization never started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    elapsed = seconds_until_idle(srv, "victim-mat")
    print(f"\nkilled mid-Materialize -> ledger zero in {elapsed:.3f} s")
    assert elapsed <= GRACE_S + 1.0
    srv.assert_idle(client="victim-mat")


def test_kill_mid_fetch_frees_everything(srv):
    proc = spawn(srv, "victim-fetch", "fetch", 64 << 20)
    wait_line(proc, "fetching")
    time.sleep(0.3)  # a few chunks in
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    elapsed = seconds_until_idle(srv, "victim-fetch")
    print(f"\nkilled mid-fetch -> ledger zero in {elapsed:.3f} s")
    assert elapsed <= GRACE_S + 1.0
    srv.assert_idle(client="victim-fetch")


def test_resume_within_grace_keeps_the_handles(srv):
    pb = srv.pb
    a = srv.attach("resumer")
    md = srv.session_md("resumer", a.session_id)
    h = srv.stub.Materialize(pb.MaterializeRequest(model=small_model(pb)),
                             metadata=md).handle
    a.crash()
    time.sleep(GRACE_S / 4)
    b = srv.attach("resumer", resume_token=a.resume_token)
    assert b.resumed and b.session_id == a.session_id
    time.sleep(GRACE_S + 0.5)  # past the grace of the first stream
    info = srv.describe(h, client="resumer")
    assert info.session == a.session_id
    # One stream at a time.
    with pytest.raises(grpc.RpcError) as e:
        srv.attach("resumer", resume_token=a.resume_token)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    b.close()
    assert seconds_until_idle(srv, "resumer") <= GRACE_S + 1.0


def test_session_refusals(srv):
    pb = srv.pb
    with pytest.raises(grpc.RpcError) as e:
        srv.attach("stranger", resume_token="r-" + "0" * 32)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown or expired" in e.value.details()
    a = srv.attach("owner")
    # Another client cannot bind handles to the session, or resume it.
    with pytest.raises(grpc.RpcError) as e:
        srv.stub.Materialize(pb.MaterializeRequest(model=small_model(pb)),
                             metadata=srv.session_md("intruder", a.session_id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    a.crash()
    with pytest.raises(grpc.RpcError) as e:
        srv.attach("intruder", resume_token=a.resume_token)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    srv.assert_idle(client="intruder")
    # Expired: the token is worthless after the grace period.
    time.sleep(GRACE_S + 0.5)
    with pytest.raises(grpc.RpcError) as e:
        srv.attach("owner", resume_token=a.resume_token)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_leases_lapse_unless_renewed(srv):
    pb = srv.pb
    ttl = pb.MaterializeRequest().ttl.__class__(seconds=1)
    lapsing = srv.materialize(pb.MaterializeRequest(model=small_model(pb),
                                                    ttl=ttl), client="lessee")
    renewed = srv.materialize(pb.MaterializeRequest(model=small_model(pb, name="r"),
                                                    ttl=ttl), client="lessee")
    info = srv.describe(renewed.handle, client="lessee")
    assert info.lease_expires_at.seconds > 0 and not info.session
    for _ in range(6):  # 2.4 s of renewals every 0.4 s
        time.sleep(0.4)
        r = srv.stub.Renew(pb.RenewRequest(handle=renewed.handle),
                           metadata=srv.md("lessee"))
        assert r.lease_expires_at.seconds > 0
    with pytest.raises(grpc.RpcError) as e:
        srv.describe(lapsing.handle, client="lessee")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    srv.describe(renewed.handle, client="lessee")  # still there
    srv.release(renewed.handle, client="lessee")
    srv.assert_idle(client="lessee")
    # Renewing a session-bound handle is a mistake with a clear answer.
    a = srv.attach("lessee")
    h = srv.stub.Materialize(pb.MaterializeRequest(model=small_model(pb)),
                             metadata=srv.session_md("lessee", a.session_id)).handle
    with pytest.raises(grpc.RpcError) as e:
        srv.stub.Renew(pb.RenewRequest(handle=h), metadata=srv.md("lessee"))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    a.close()
    assert seconds_until_idle(srv, "lessee") <= GRACE_S + 1.0


def test_bad_ttl_is_invalid(srv):
    pb = srv.pb
    Duration = pb.MaterializeRequest().ttl.__class__
    for ttl in (Duration(seconds=0), Duration(seconds=-5),
                Duration(seconds=400 * 24 * 3600)):
        with pytest.raises(grpc.RpcError) as e:
            srv.materialize(pb.MaterializeRequest(model=small_model(pb), ttl=ttl),
                            client="ttl")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ttl" in e.value.details()
    srv.assert_idle(client="ttl")


def server_rss_kib(srv):
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_churn_of_32_clients_leaves_nothing(srv):
    """32 clients x 6 cycles of attach / materialize / part of a fetch /
    release or crash; every counter returns to zero and the server's RSS
    grows by less than 64 MiB."""
    pb, pb_grpc = serverproc.import_protos()
    rss_before = server_rss_kib(srv)
    errors = []

    def client(n):
        name = f"churn-{n}"
        channel = grpc.insecure_channel(srv.address)
        stub = pb_grpc.MaterializerStub(channel)
        try:
            for cycle in range(6):
                a = srv.attach(name, channel=channel)
                md = srv.session_md(name, a.session_id)
                h = stub.Materialize(pb.MaterializeRequest(
                    model=small_model(pb, 1 << 20)), metadata=md).handle
                stream = stub.FetchWeights(pb.FetchRequest(handle=h,
                                                           chunk_bytes=65536),
                                           metadata=md)
                next(stream)
                stream.cancel()
                if (n + cycle) % 2:
                    stub.Release(pb.ReleaseRequest(handle=h), metadata=md)
                    a.close()
                else:
                    a.crash()
        except Exception as e:  # surfaced below
            errors.append(f"{name}: {e!r}")
        finally:
            channel.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    deadline = time.monotonic() + GRACE_S + 5
    while True:
        s = srv.stats()
        if s.reserved_bytes == 0 and s.in_use_bytes == 0 and s.handles == 0:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.05)
    for d in s.devices:
        assert d.reserved_bytes == 0 and d.in_use_bytes == 0 and d.handles == 0
    growth_mib = (server_rss_kib(srv) - rss_before) / 1024
    print(f"\nchurn: server RSS grew by {growth_mib:.1f} MiB")
    assert growth_mib < 64
