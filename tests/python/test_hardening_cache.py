"""Memory a client can make the server hold outside the ledger is bounded:
DescribeFile / FetchWeights with ever different filters used to grow a
per-handle cache keyed by the filter text (150 calls with ~2 MiB excludes:
+300 MiB of server RSS, nothing in the ledger)."""

import grpc

import serverproc

CALLS = 150


def rss_mib(srv):
    return serverproc.rss_bytes(srv.proc.pid) / 2**20


def test_distinct_filters_do_not_grow_the_server(server):
    pb = server.pb
    req = server.parse_request(
        '{"model": {"tensors": ['
        '{"name": "a.weight", "shape": [256], "dtype": "float32"},'
        '{"name": "w.weight", "shape": [256], "dtype": "float32"}],'
        ' "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}')
    with server.handle(req) as h:
        # Warm up the allocator and the handle's per-tensor digests.
        server.stub.DescribeFile(pb.FetchRequest(handle=h.handle), timeout=60)
        before = rss_mib(server)
        outcomes = {}
        # 1) The most a request may carry within the documented limits:
        # 256 patterns of 512 bytes per filter, every call different.
        for i in range(2 * CALLS):
            patterns = ["w" + "*" * (511 - k) for k in range(256)]
            patterns[0] = "w.*" + "*" * i
            try:
                server.stub.DescribeFile(
                    pb.FetchRequest(handle=h.handle, exclude=patterns),
                    timeout=60)
                outcomes["OK"] = outcomes.get("OK", 0) + 1
            except grpc.RpcError as e:
                outcomes[e.code().name] = outcomes.get(e.code().name, 0) + 1
        after_limit = rss_mib(server)
        within_limits = outcomes
        outcomes = {}
        # 2) ~2 MiB patterns, each different ("w" then stars: matches
        # w.weight only, so each is a valid filter of today's syntax).
        for i in range(CALLS):
            pattern = "w" + "*" * ((2 << 20) + i)
            try:
                server.stub.DescribeFile(
                    pb.FetchRequest(handle=h.handle, exclude=[pattern]),
                    timeout=60)
                outcomes["OK"] = outcomes.get("OK", 0) + 1
            except grpc.RpcError as e:
                outcomes[e.code().name] = outcomes.get(e.code().name, 0) + 1
        after_huge = rss_mib(server)
        print(f"\nserver RSS {before:.1f} MiB; after {2 * CALLS} DescribeFile "
              f"calls with distinct 256 x 512-byte excludes: "
              f"{after_limit:.1f} MiB ({after_limit - before:+.1f}); after "
              f"{CALLS} more with distinct ~2 MiB excludes: "
              f"{after_huge:.1f} MiB ({after_huge - after_limit:+.1f}); "
              f"answers: {within_limits}, then {outcomes}")
        # Nothing the client holds shows up in the ledger beyond its handle.
        usage, handles = server.client_usage(None)
        assert handles == 1
        assert after_limit - before < 16, (before, after_limit)
        assert after_huge - after_limit < 32, (after_limit, after_huge)
        # The filters within the limits were served.
        assert within_limits == {"OK": 2 * CALLS}, within_limits
    server.assert_idle()
