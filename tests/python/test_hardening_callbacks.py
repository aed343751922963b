"""No request work on gRPC's callback threads: hostile FetchWeights
filters (a class of 2 MiB against long tensor names) used to run their glob
matching there, so two such calls stopped health checks, keepalive and
every other client's session. Now they are refused by the documented limits
(on a worker), matching is linear, and health keeps answering throughout."""

import threading
import time

import grpc

import serverproc

HOSTILE = "*[" + "b" * (2 << 20) + "]c"
# Within the limits (512 bytes), and the worst shape for a backtracking
# matcher; the first matches every tensor, the second one of them.
WORST_INCLUDE = "*" + "a*" * 255 + "t"
WORST_EXCLUDE = "*" + "a*" * 250 + "000.weight"


def test_hostile_filters_do_not_stall_health_or_other_clients():
    with serverproc.running_server(["--workers=2", "--session_grace=1s"]) as srv:
        pb = srv.pb
        names = [f"{'a' * 480}.{i:03d}.weight" for i in range(64)]
        req = srv.parse_request(
            '{"model": {"tensors": [%s], "initRules": [{"pattern": "*", '
            '"init": {"ones": {}}}]}}' % ",".join(
                f'{{"name": "{n}", "shape": [4], "dtype": "float32"}}'
                for n in names))
        hostile_resp = srv.materialize(req, client="mallory")
        # Another client holds a session with a handle in it.
        session = srv.attach(client="bob")
        bob_req = srv.parse_request(
            '{"model": {"tensors": [{"name": "w", "shape": [4], "dtype": '
            '"float32"}], "initRules": [{"pattern": "*", "init": '
            '{"zeros": {}}}]}}')
        bob_handle = srv.stub.Materialize(
            bob_req, metadata=srv.session_md("bob", session.session_id),
            timeout=30).handle

        results = []

        def hostile(pattern, field):
            start = time.monotonic()
            try:
                list(srv.stub.FetchWeights(
                    pb.FetchRequest(handle=hostile_resp.handle,
                                    **{field: [pattern]}),
                    metadata=srv.md("mallory"), timeout=60))
                results.append(("OK", time.monotonic() - start, ""))
            except grpc.RpcError as e:
                results.append((e.code().name, time.monotonic() - start,
                                 e.details() or ""))

        threads = [threading.Thread(target=hostile, args=(p, f))
                   for p, f in ((HOSTILE, "include"), (HOSTILE, "exclude"),
                                (WORST_INCLUDE, "include"),
                                (WORST_EXCLUDE, "exclude"))]
        for t in threads:
            t.start()
        # Health answers within 1 s every 0.25 s while the calls run (and
        # for a while after, at most 12 s in all).
        health = []
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            start = time.monotonic()
            ok = serverproc.health_serving(srv.channel, timeout=1.0)
            health.append((ok, time.monotonic() - start))
            if not any(t.is_alive() for t in threads) and len(health) >= 8:
                break
            time.sleep(0.25)
        for t in threads:
            t.join(timeout=120)
        failed_checks = [h for h in health if not h[0]]
        print(f"\nhealth checks: {len(health)}, failed: {len(failed_checks)}, "
              f"slowest {max(h[1] for h in health) * 1e3:.1f} ms; hostile "
              f"fetches: {[(r[0], round(r[1], 2)) for r in results]}")
        assert not failed_checks, health
        assert len(results) == 4, results
        for code, seconds, details in results:
            if code == "INVALID_ARGUMENT":
                assert "bytes; the limit is" in details, details[:300]
            else:  # the patterns within the limits are served
                assert code == "OK", (code, details[:300])
            assert seconds < 10, results
        # Bob's session and handle are untouched.
        assert srv.describe(bob_handle, client="bob").handle == bob_handle
        srv.release(bob_handle, client="bob")
        session.close()
        srv.release(hostile_resp.handle, client="mallory")
