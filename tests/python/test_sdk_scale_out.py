"""Scale-out through the trainer SDK: materializer.Client and
materializer.materialize() given several replicas (loopback ports standing
in for the pods behind a headless Service) follow docs/api.md, "Several
replicas": Materialize lands on the replica with the most free memory,
every call about a handle goes to the replica its id names, ListHandles
merges them, sessions are per replica, and a replica that goes away makes
its handles fail clearly while the others keep serving."""

import socket
import time
from concurrent import futures

import grpc
import pytest
import torch
import torch.nn as nn

import materializer as mz
import serverproc
from materializer.client import replicas as replica_routing
from test_scale_out import CLIENT, replicas, start

MiB = 1 << 20
GRACE_S = 1.0
SESSION_GRACE = f"--session_grace={GRACE_S:g}s"


def model(mib):
    """A module of `mib` MiB of float32 parameters (an embedding with
    normal init, a linear layer), on the meta device."""
    with mz.meta_device():
        return nn.Sequential(nn.Embedding(mib * 256, 1024), nn.Linear(1024, 8))


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def target(rs):
    return ",".join(r.address for r in rs)


def in_use(r):
    """(handles, bytes reserved or in use) on replica `r`, for everyone."""
    s = r.stub.GetStats(r.pb.GetStatsRequest(),
                        metadata=((serverproc.CLIENT_KEY, CLIENT),), timeout=30)
    return s.handles, s.reserved_bytes + s.in_use_bytes


def wait_idle(rs, seconds):
    deadline = time.monotonic() + seconds
    while any(in_use(r) != (0, 0) for r in rs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {r.name: in_use(r) for r in rs}


@pytest.fixture(scope="module")
def single():
    """One unnamed server: what the replicas' bytes are compared with."""
    with serverproc.running_server() as s:
        yield s


def test_three_replicas_route_by_room_and_by_handle(single):
    # 40 MiB models: r1 has the most room, then r2, then r0 (as each
    # handle takes 40 MiB of its replica's room).
    with replicas([("r0", "64MiB"), ("r1", "96MiB"), ("r2", "80MiB")]) as rs:
        r0, r1, r2 = rs
        with mz.Client(target(rs), client_name=CLIENT) as client:
            assert client.has_replicas()
            models = [model(40) for _ in range(3)]
            # One through each path: stream (FetchWeights and DescribeFile),
            # parallel streams (fetch lanes), shared memory (ExportHandle,
            # CloseExport).
            made = [mz.materialize(m, client=client, seed=i, keep_handle=True,
                                   transport=t, streams=s)
                    for i, (m, t, s) in enumerate(zip(models, ("stream", "stream", "shm"),
                                                      (1, 2, 1)))]
            a, b, c = (r.handle for r in made)
            assert [h.rsplit("@", 1)[1] for h in (a, b, c)] == ["r1", "r2", "r0"]
            assert [r.transport for r in made] == ["stream", "stream", "shm"]
            assert (r0.handles(), r1.handles(), r2.handles()) == ([c], [a], [b])

            # The bytes are those one unnamed server gives for the same seeds.
            for i, m in enumerate(models):
                alone = model(40)
                mz.materialize(alone, server=single.address, seed=i, transport="stream")
                want = state(alone)
                got = state(m)
                assert got.keys() == want.keys()
                for k in want:
                    assert torch.equal(got[k], want[k]), k

            # Calls naming a handle reach the replica holding it (any other
            # would answer NOT_FOUND).
            for h in (a, b, c):
                assert client.describe(h).handle == h
                assert client.describe_file(h).total_bytes > 40 * MiB
                assert sum(len(ch.data) for ch in client.fetch(h, lane=1)) > 40 * MiB
                if h != c:  # not exportable: the holder says so
                    with pytest.raises(mz.RpcError) as e:
                        client.export(h)
                    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
                    continue
                export = client.export(h)
                assert export.export_id.endswith("@r0")
                client.close_export(export.export_id)

            listed = client.list_handles()
            assert [x.handle for x in listed] == [a, b, c] and listed.failed == []

            per = client.stats_by_replica()
            assert [(e.replica, e.address) for e in per] == \
                [(r.name, r.address) for r in rs]
            assert [e.result.handles for e in per] == [1, 1, 1]
            assert client.stats(replica="r2").handles == 1
            with pytest.raises(ValueError, match="several replicas"):
                client.stats()
            found = client.replicas()
            assert [e.replica for e in found] == ["r0", "r1", "r2"]
            assert [e.result.devices[0].capacity_bytes for e in found] == \
                [64 * MiB, 96 * MiB, 80 * MiB]

            # Released on r1, which then has the most room again (96 MiB
            # free; r0 24, r2 40): Plan and Materialize go there.
            client.release(a)
            assert (r0.handles(), r1.handles(), r2.handles()) == ([c], [], [b])
            plan = client.plan(mz.describe(model(40)).to_proto())
            assert [(d.available_bytes, d.fits) for d in plan.devices] == [(96 * MiB, True)]
            again = client.materialize(mz.describe(model(40)).to_proto())
            assert again.handle.endswith("@r1")
            for h in (b, c, again.handle):
                client.release(h, force=True)
        assert wait_idle(rs, 5) == {"r0": (0, 0), "r1": (0, 0), "r2": (0, 0)}


def test_sessions_are_per_replica_and_closing_frees_every_one():
    with replicas([("r0", "32MiB"), ("r1", "48MiB")], extra=[SESSION_GRACE]) as rs:
        client = mz.Client(target(rs), client_name=CLIENT)
        first = mz.materialize(model(20), client=client, keep_handle=True, transport="stream")
        second = mz.materialize(model(20), client=client, keep_handle=True, transport="stream")
        assert first.handle.endswith("@r1") and second.handle.endswith("@r0")
        s0, s1 = client.session(second.handle), client.session(first.handle)
        assert s0.id != s1.id
        assert client.describe(first.handle).session == s1.id
        assert client.describe(second.handle).session == s0.id
        with pytest.raises(ValueError, match="several replicas"):
            client.session()
        assert all(in_use(r)[0] == 1 for r in rs)
        client.close()
        # Each replica releases the session's handles after its grace period.
        assert wait_idle(rs, GRACE_S + 10) == {"r0": (0, 0), "r1": (0, 0)}


def test_a_replica_going_away():
    with replicas([("r0", "64MiB"), ("r1", "96MiB"), ("r2", "80MiB")]) as rs:
        r0, r1, r2 = rs
        with mz.Client(target(rs), client_name=CLIENT, deadline=20) as client:
            on_r1 = client.materialize(mz.describe(model(40)).to_proto()).handle
            m = model(40)
            on_r2 = mz.materialize(m, client=client, keep_handle=True,
                                   transport="stream").handle
            assert on_r1.endswith("@r1") and on_r2.endswith("@r2")
            r2.kill()

            # Its handles: UNAVAILABLE (its address is still in the target,
            # so it may come back), naming the replica and its address.
            t0 = time.monotonic()
            for call in (lambda: client.describe(on_r2),
                         lambda: list(client.fetch(on_r2)),
                         lambda: client.release(on_r2)):
                with pytest.raises(mz.RpcError) as e:
                    call()
                assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
                assert f"replica r2 ({r2.address}) did not answer" in e.value.message
            assert time.monotonic() - t0 < 15  # not the call deadline each

            # The others keep serving.
            assert client.describe(on_r1).handle == on_r1
            again = mz.materialize(model(8), client=client, keep_handle=True).handle
            assert not again.endswith("@r2")
            listed = client.list_handles()
            assert sorted(x.handle for x in listed) == sorted([on_r1, again])
            assert [f.address for f in listed.failed] == [r2.address]
            per = client.stats_by_replica()
            assert [(e.replica, e.error is None) for e in per] == \
                [("r0", True), ("r1", True), ("", False)]
            assert per[2].address == r2.address

            # A client that never met r2 says the same from discovery.
            with mz.Client(target(rs), client_name=CLIENT, session=False) as fresh:
                with pytest.raises(mz.RpcError) as e:
                    fresh.describe(on_r2)
                assert e.value.code == grpc.StatusCode.UNAVAILABLE
                assert "held by replica r2" in e.value.message
                assert f"{r2.address} did not answer" in e.value.message

            # Once r2's address is gone from the target too (its pod left the
            # Service), r2 is known to be gone: NOT_FOUND.
            with mz.Client(target([r0, r1]), client_name=CLIENT, session=False) as known:
                with pytest.raises(mz.RpcError) as e:
                    known.describe(on_r2)
                assert e.value.code == grpc.StatusCode.NOT_FOUND
                assert "held by replica r2" in e.value.message
                assert "has gone away" in e.value.message
                assert known.describe(on_r1).handle == on_r1
            for h in (on_r1, again):
                client.release(h)
        assert wait_idle([r0, r1], 5) == {"r0": (0, 0), "r1": (0, 0)}


def test_a_name_with_several_addresses(monkeypatch):
    """A headless Service's name resolves to one address per pod: two
    replicas on one port of two loopback addresses, behind one name."""
    first = start("r0", "32MiB", [SESSION_GRACE, "--listen=127.0.0.2:0"])
    try:
        port = first.address.rsplit(":", 1)[1]
        second = start("r1", "48MiB", [SESSION_GRACE, f"--listen=127.0.0.3:{port}"])
    except BaseException:
        first.kill()
        raise
    rs = [first, second]
    try:
        real = socket.getaddrinfo

        def look_up(host, *args, **kwargs):
            if host != "materializer.test":
                return real(host, *args, **kwargs)
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.3", 0))]

        monkeypatch.setattr(replica_routing.socket, "getaddrinfo", look_up)
        assert replica_routing.resolve_target(f"materializer.test:{port}") == (
            [(f"127.0.0.2:{port}", "materializer.test"),
             (f"127.0.0.3:{port}", "materializer.test")], [])
        with mz.Client(f"materializer.test:{port}", client_name=CLIENT) as client:
            m = model(8)
            r = mz.materialize(m, client=client, keep_handle=True, transport="stream")
            assert r.handle.endswith("@r1")
            assert client.describe(r.handle).handle == r.handle
            assert [e.replica for e in client.replicas()] == ["r0", "r1"]
            assert (first.handles(), second.handles()) == ([], [r.handle])
        assert wait_idle(rs, GRACE_S + 10) == {"r0": (0, 0), "r1": (0, 0)}
    finally:
        for r in rs:
            r.channel.close()
            if r.proc.poll() is None:
                r.proc.terminate()
                r.proc.wait(timeout=serverproc.SHUTDOWN_TIMEOUT_S)


class OldServer:
    """An in-process server from before GetServerInfo (and before replica
    names): it knows some handle ids and records the calls it gets."""

    def __init__(self, pb, pb_grpc, known):
        self.calls = []
        outer = self

        class Servicer(pb_grpc.MaterializerServicer):
            def Describe(self, request, context):
                outer.calls.append("Describe")
                if request.handle not in known:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"handle {request.handle} not found")
                return pb.HandleInfo(handle=request.handle, label=known[request.handle])

            def ListHandles(self, request, context):
                outer.calls.append("ListHandles")
                return pb.ListHandlesResponse(
                    handles=[pb.HandleSummary(handle=h) for h in known])

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_MaterializerServicer_to_server(Servicer(), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self):
        self.server.stop(None)


def test_one_unnamed_server_and_old_servers():
    pb, pb_grpc = serverproc.import_protos()
    one, two = "h-" + "1" * 32, "h-" + "2" * 32
    a = OldServer(pb, pb_grpc, {one: "on a"})
    b = OldServer(pb, pb_grpc, {two: "on b"})
    try:
        # One address: exactly the calls asked for, no discovery.
        with mz.Client(a.address, session=False) as client:
            assert not client.has_replicas()
            assert client.describe(one).label == "on a"
            assert [h.handle for h in client.list_handles()] == [one]
        assert a.calls == ["Describe", "ListHandles"]

        # Two old servers (GetServerInfo UNIMPLEMENTED): unnamed replicas;
        # an id naming no replica is asked of each in turn.
        a.calls.clear()
        with mz.Client(f"{a.address},{b.address}", session=False) as client:
            assert client.has_replicas()
            assert client.describe(two).label == "on b"
            assert client.describe(one).label == "on a"
            assert sorted(h.handle for h in client.list_handles()) == [one, two]
            with pytest.raises(mz.RpcError) as e:
                client.describe("h-" + "3" * 32)
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        assert b.calls.count("Describe") >= 1 and "ListHandles" in b.calls
    finally:
        a.stop()
        b.stop()


def test_target_and_room_rules():
    assert replica_routing.split_target(" 127.0.0.1:1 , [::1]:2") == ["127.0.0.1:1", "[::1]:2"]
    assert replica_routing.split_target("unix:/run/m.sock") == ["unix:/run/m.sock"]
    for bad, why in (("", "empty"), ("a:1,,b:2", "empty item"), ("host", "not host:port"),
                     ("host:0", "not host:port")):
        with pytest.raises(ValueError, match=why):
            replica_routing.split_target(bad)
    # localhost is one server (its IPv4 address only).
    assert replica_routing.resolve_target("localhost:7,127.0.0.1:7,127.0.0.1:8") == (
        [("127.0.0.1:7", "localhost"), ("127.0.0.1:7", ""), ("127.0.0.1:8", "")], [])
    assert replica_routing.replica_of_id("x-" + "a" * 32 + "-h-" + "b" * 32 + "@r-2") == "r-2"
    assert replica_routing.replica_of_id("h-" + "b" * 32) == ""

    pb, _ = serverproc.import_protos()

    def info(**free):
        return pb.ServerInfo(devices=[pb.DeviceRoom(device=d.replace("_", ":"), free_bytes=f)
                                      for d, f in free.items()])

    big_gpu = info(cpu=10, cuda_0=5, cuda_1=30)
    big_cpu = info(cpu=40, cuda_0=20)
    infos = [big_gpu, big_cpu]
    choose = replica_routing.choose_replica
    assert choose(infos, pb.Placement()) == 1              # 40 > 30
    assert choose(infos, pb.Placement(device="cuda")) == 0  # 30 > 20
    assert choose(infos, pb.Placement(device="cuda:0")) == 1
    assert choose(infos, pb.Placement(device="split")) == 1  # 60 > 45
    assert choose(infos, pb.Placement(device="split", split=pb.SplitPlacement(
        devices=["cuda:0", "cuda:1"]))) == 0                # 35 > 20
    assert choose([info(cpu=1), info(cuda_0=9)], pb.Placement(device="cuda")) == 1
    assert choose([info(cpu=1), info(cpu=2)], pb.Placement(device="cuda")) == 0  # none
    assert choose([info(cpu=3), info(cpu=3)], pb.Placement()) == 0                # tie
