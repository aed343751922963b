"""Identity is per call: on one TLS connection, calls carrying different
bearer tokens are each served as the client their own token names, and the
cost of a call does not grow with the calls made before it on the same
connection (issue: the token's client used to be added to the connection's
auth context, so the first token on a connection named every later caller,
and each call appended to it)."""

import statistics
import time

import grpc
import pytest

import serverproc

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-fedcba9876543210"
CALLS = 10000
WINDOW = 1000


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    serverproc.make_tls_pki(d)
    tokens = d / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n")
    with serverproc.running_server(
            [f"--tls_cert={d / 'server.pem'}", f"--tls_key={d / 'server.key'}",
             f"--token_file={tokens}"], connect=False) as srv:
        srv.ca = (d / "ca.pem").read_bytes()
        yield srv


def secure_channel(srv):
    port = srv.address.rsplit(":", 1)[1]
    creds = grpc.ssl_channel_credentials(root_certificates=srv.ca)
    return grpc.secure_channel(f"localhost:{port}", creds)


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


def tiny_model(pb):
    return pb.MaterializeRequest(model=pb.ModelSpec(
        tensors=[pb.TensorSpec(name="w", shape=[64], dtype="float32")],
        init_rules=[pb.InitRule(pattern="*",
                                init=pb.InitScheme(ones=pb.Ones()))]))


def test_each_call_is_served_as_the_client_its_token_names(tls_server):
    pb, pb_grpc = serverproc.import_protos()
    ch = secure_channel(tls_server)
    stub = pb_grpc.MaterializerStub(ch)
    # Alice's call comes first on this connection.
    h_alice = stub.Materialize(tiny_model(pb), metadata=bearer(ALICE),
                               timeout=30).handle
    h_bob = stub.Materialize(tiny_model(pb), metadata=bearer(BOB),
                             timeout=30).handle
    try:
        # 10,000 calls on one connection, alternating tokens: each answer
        # is the caller's own entry only. Failures are counted rather than
        # raised at once, so the figures below are printed either way.
        pid = tls_server.proc.pid
        latencies = []
        wrong = []
        rss = {}
        for i in range(CALLS):
            who, token = ("alice", ALICE) if i % 2 == 0 else ("bob", BOB)
            start = time.perf_counter()
            stats = stub.GetStats(pb.GetStatsRequest(),
                                  metadata=bearer(token), timeout=10)
            latencies.append(time.perf_counter() - start)
            seen = [c.client for c in stats.clients]
            if seen != [who]:
                wrong.append((i, who, seen))
            if i + 1 == WINDOW:
                rss["after_first_window"] = serverproc.rss_bytes(pid)
        rss["end"] = serverproc.rss_bytes(pid)
        first = statistics.median(latencies[:WINDOW]) * 1e3
        last = statistics.median(latencies[-WINDOW:]) * 1e3
        growth_mib = (rss["end"] - rss["after_first_window"]) / 2**20
        print(f"\n{CALLS} calls alternating tokens on one connection: "
              f"{len(wrong)} answered as the wrong client; median latency "
              f"first {WINDOW}: {first:.3f} ms, last {WINDOW}: {last:.3f} ms; "
              f"server RSS after call {WINDOW}: "
              f"{rss['after_first_window'] / 2**20:.1f} MiB, at the end: "
              f"{rss['end'] / 2**20:.1f} MiB ({growth_mib:+.2f} MiB)")
        assert not wrong, f"{len(wrong)} calls answered as another client, " \
                          f"first: {wrong[:3]}"
        # Loose bounds: flat means no growth with the number of calls made,
        # not a speed claim.
        assert last < 1.5 * first + 0.2, (first, last)
        assert growth_mib < 1, growth_mib

        info = stub.Describe(pb.DescribeRequest(handle=h_alice),
                             metadata=bearer(ALICE), timeout=10)
        assert info.owner == "alice"
        info = stub.Describe(pb.DescribeRequest(handle=h_bob),
                             metadata=bearer(BOB), timeout=10)
        assert info.owner == "bob"
        with pytest.raises(grpc.RpcError) as e:
            stub.Describe(pb.DescribeRequest(handle=h_alice),
                          metadata=bearer(BOB), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

        # A fresh connection whose first call carries Bob's token.
        other = secure_channel(tls_server)
        other_stub = pb_grpc.MaterializerStub(other)
        other_stub.ListHandles(pb.ListHandlesRequest(), metadata=bearer(BOB),
                               timeout=10)
        info = other_stub.Describe(pb.DescribeRequest(handle=h_alice),
                                   metadata=bearer(ALICE), timeout=10)
        assert info.owner == "alice"
        other.close()
    finally:
        for handle, token in ((h_alice, ALICE), (h_bob, BOB)):
            try:
                stub.Release(pb.ReleaseRequest(handle=handle),
                             metadata=bearer(token), timeout=10)
            except grpc.RpcError:
                pass  # reported by the assertions above
        ch.close()


def test_missing_and_unknown_tokens_are_refused_per_call(tls_server):
    pb, pb_grpc = serverproc.import_protos()
    ch = secure_channel(tls_server)
    stub = pb_grpc.MaterializerStub(ch)
    # A good call first: it must not vouch for the calls after it.
    stub.ListHandles(pb.ListHandlesRequest(), metadata=bearer(ALICE),
                     timeout=10)
    for md in (None, bearer("not-a-known-token-000"),
               (("authorization", "Basic " + ALICE),)):
        with pytest.raises(grpc.RpcError) as e:
            stub.ListHandles(pb.ListHandlesRequest(), metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, md
        assert ALICE not in (e.value.details() or "")
    ch.close()
