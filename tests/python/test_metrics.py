"""Prometheus metrics scraped during a workload and checked against GetStats
(ledger, per-client figures, handle counts) and against what the test did
(RPCs by method and code, fetch bytes, sessions, exports, cleanup)."""

import collections
import time

import grpc
import pytest

import scrape
import serverproc

GRACE_S = 0.3
MIB = 1 << 20


@pytest.fixture(scope="module")
def srv():
    with serverproc.running_server(
            ["--metrics_listen=127.0.0.1:0", f"--session_grace={GRACE_S}s",
             "--log_level=info", "--admin_clients=ops",
             "--metrics_client_labels=2"],
            devices="cpu:2", cpu_capacity="512MiB") as s:
        yield s


class Calls:
    """Makes RPCs and counts them by (method, status code name), as the
    server should."""

    def __init__(self, srv):
        self.srv = srv
        self.pb = srv.pb
        self.counts = collections.Counter()

    def unary(self, method, request, client, session=None):
        md = (self.srv.session_md(client, session) if session
              else self.srv.md(client))
        try:
            response = getattr(self.srv.stub, method)(request, metadata=md,
                                                      timeout=60)
        except grpc.RpcError as e:
            self.counts[(method, e.code().name)] += 1
            raise
        self.counts[(method, "OK")] += 1
        return response

    def fetch(self, handle, client, offset=0):
        chunks = list(self.srv.stub.FetchWeights(
            self.pb.FetchRequest(handle=handle, offset=offset),
            metadata=self.srv.md(client), timeout=60))
        self.counts[("FetchWeights", "OK")] += 1
        return sum(len(c.data) for c in chunks)

    def stats(self):
        return self.unary("GetStats", self.pb.GetStatsRequest(), "ops")

    def materialize(self, client, nbytes, device, session=None, **kw):
        pb = self.pb
        model = pb.ModelSpec(
            tensors=[pb.TensorSpec(name="w", shape=[nbytes // 4],
                                   dtype="float32")],
            init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
                normal=pb.Normal(std=0.02)))],
            seed=3)
        return self.unary("Materialize", pb.MaterializeRequest(
            model=model, placement=pb.Placement(device=device), **kw),
            client, session)


def check_ledger_figures(samples, stats):
    """Every device and client figure of the scrape equals GetStats."""
    for d in stats.devices:
        for metric, field in (
                ("materializer_device_capacity_bytes", "capacity_bytes"),
                ("materializer_device_reserved_bytes", "reserved_bytes"),
                ("materializer_device_in_use_bytes", "in_use_bytes"),
                ("materializer_device_peak_bytes", "peak_bytes"),
                ("materializer_device_handles", "handles")):
            assert scrape.value(samples, metric, device=d.device) == \
                getattr(d, field), (metric, d.device)
    assert scrape.value(samples, "materializer_clients") == len(stats.clients)
    assert scrape.value(samples, "materializer_handles", state="ready") == \
        stats.handles
    assert scrape.value(samples, "materializer_handles",
                        state="materializing") == 0


def test_scrape_matches_get_stats_and_the_workload(srv):
    calls = Calls(srv)
    url = scrape.metrics_url(srv)
    pb = srv.pb

    # Four clients holding memory: alice the most, then bob, then dave and
    # carol (whose handle is bound to a session) with 1 MiB each.
    a1 = calls.materialize("alice", 4 * MIB, "cpu:0")
    a2 = calls.materialize("alice", 8 * MIB, "cpu:1")
    b1 = calls.materialize("bob", 2 * MIB, "cpu:1")
    d1 = calls.materialize("dave", 1 * MIB, "cpu:0", exportable=True)
    attach = srv.attach("carol")
    calls.counts[("Attach", "OK")] += 1  # counted when the stream ends
    c1 = calls.materialize("carol", 1 * MIB, "cpu:1",
                           session=attach.session_id)
    materialized = [a1, a2, b1, d1, c1]

    # Failing calls: a handle that does not exist, a tensor without shape.
    with pytest.raises(grpc.RpcError):
        calls.unary("Describe", pb.DescribeRequest(handle="h-" + "0" * 32),
                    "alice")
    with pytest.raises(grpc.RpcError) as bad:
        calls.unary("Materialize", pb.MaterializeRequest(model=pb.ModelSpec(
            tensors=[pb.TensorSpec(name="x", dtype="float32")])), "bob")
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # A fetch, and a resumed one from the middle.
    fetched = calls.fetch(a1.handle, "alice")
    fetched += calls.fetch(a1.handle, "alice", offset=fetched // 2)

    # An export of dave's shared-memory handle, opened and closed.
    export = calls.unary("ExportHandle", pb.ExportRequest(handle=d1.handle),
                         "dave")
    calls.unary("CloseExport", pb.CloseExportRequest(
        export_id=export.export_id), "dave")

    # During the workload: the scrape agrees with GetStats.
    during = scrape.scrape(url)
    stats = calls.stats()
    check_ledger_figures(during, stats)
    assert len(stats.clients) == 4
    by_client = {c.client: c for c in stats.clients}
    # The two clients with the most bytes are named; the others are summed.
    for name in ("alice", "bob"):
        c = by_client[name]
        assert scrape.value(during, "materializer_client_in_use_bytes",
                            client=name) == c.in_use_bytes
        assert scrape.value(during, "materializer_client_reserved_bytes",
                            client=name) == c.reserved_bytes
        assert scrape.value(during, "materializer_client_handles",
                            client=name) == c.handles
    others = [by_client["carol"], by_client["dave"]]
    assert scrape.value(during, "materializer_client_in_use_bytes",
                        client="(other)") == sum(c.in_use_bytes for c in others)
    assert scrape.value(during, "materializer_client_handles",
                        client="(other)") == sum(c.handles for c in others)
    assert scrape.get(during, "materializer_client_in_use_bytes", None,
                      client="carol") is None
    assert scrape.value(during, "materializer_sessions") == 1

    # The session ends (grace period), a lease lapses, alice releases one.
    calls.unary("Release", pb.ReleaseRequest(handle=a2.handle), "alice")
    attach.close()
    leased = calls.materialize(
        "dave", 1 * MIB, "cpu:0",
        ttl=pb.MaterializeRequest().ttl.__class__(nanos=300_000_000))
    materialized.append(leased)
    deadline = time.monotonic() + 20
    while True:
        stats = calls.stats()
        holders = {c.client: c.handles for c in stats.clients}
        if "carol" not in holders and holders.get("dave") == 1:
            break
        assert time.monotonic() < deadline, holders
        time.sleep(0.05)

    after = scrape.scrape(url)
    expected = dict(calls.counts)  # before the GetStats below
    stats = calls.stats()
    check_ledger_figures(after, stats)
    assert stats.handles == 3  # a1, b1, d1

    # RPCs: exactly what the test did, by method and code.
    seen = {(dict(labels)["method"], dict(labels)["code"]): v
            for (name, labels), v in after.items()
            if name == "materializer_rpcs_total"}
    assert seen == expected
    by_method = collections.Counter()
    for (method, _), n in expected.items():
        by_method[method] += n
    for method, n in by_method.items():
        assert scrape.value(after, "materializer_rpc_duration_seconds_count",
                            method=method) == n

    # Fetches, materializations, exports, sessions, cleanup.
    assert scrape.value(after, "materializer_fetch_bytes_total") == fetched
    assert scrape.value(after, "materializer_fetches_total", kind="start") == 1
    assert scrape.value(after, "materializer_fetches_total", kind="resume") == 1
    assert scrape.value(after, "materializer_materialize_phase_seconds_count",
                        phase="total") == len(materialized)
    assert scrape.value(after, "materializer_init_bytes_total",
                        rng="portable") == sum(m.tensor_bytes
                                               for m in materialized)
    assert scrape.value(after, "materializer_exports_opened_total",
                        kind="shared_memory") == 1
    assert scrape.value(after, "materializer_exports_closed_total") == 1
    assert scrape.value(after, "materializer_exports_open") == 0
    assert scrape.value(after, "materializer_sessions_opened_total") == 1
    assert scrape.value(after, "materializer_sessions_expired_total") == 1
    assert scrape.value(after, "materializer_sessions") == 0
    assert scrape.value(after, "materializer_cleanup_handles_total",
                        reason="session_end") == 1
    assert scrape.value(after, "materializer_cleanup_handles_total",
                        reason="lease_expiry") == 1
    delay = scrape.value(after, "materializer_session_release_delay_seconds_sum")
    assert GRACE_S <= delay < GRACE_S + 5, delay

    for h, client in ((a1, "alice"), (b1, "bob"), (d1, "dave")):
        srv.release(h.handle, client)


def test_bad_metrics_address_stops_the_server_with_a_reason():
    with pytest.raises(pytest.fail.Exception) as failed:
        with serverproc.running_server(["--metrics_listen=no-port"]):
            pass
    assert "host:port" in str(failed.value)
