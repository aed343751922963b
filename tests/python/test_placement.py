"""Placement on a pool of four virtual CPU devices with unequal capacities:
"auto" (best fit), "split" at module boundaries under max_memory caps, and
quotas; a split handle's bytes are the same as an unsplit one's."""

import json

import grpc
import pytest

import matutil as m
import serverproc

MIB = 1 << 20


@pytest.fixture(scope="module")
def pool():
    with serverproc.running_server(
            devices="cpu:4", cpu_capacity="64MiB,128MiB,192MiB,256MiB",
            extra_args=["--admin_clients=ops"]) as srv:
        yield srv


def model(layers, mib_per_layer, rng=None):
    """An embedding, `layers` blocks of two tensors, a tied head."""
    n = mib_per_layer * MIB // 4 // 2
    tensors = [{"name": "embed.weight", "shape": [4 * MIB // 4], "dtype": "float32"}]
    for i in range(layers):
        tensors += [{"name": f"layers.{i}.attn.weight", "shape": [n], "dtype": "float32"},
                    {"name": f"layers.{i}.mlp.weight", "shape": [n], "dtype": "float32"}]
    tensors.append({"name": "head.weight", "shape": [4 * MIB // 4],
                    "dtype": "float32", "tieTo": "embed.weight"})
    req = {"model": {"tensors": tensors,
                     "initRules": [{"pattern": "*", "init": {"normal": {"std": 0.02}}}],
                     "seed": "5"}}
    if rng:
        req["model"]["rng"] = rng
    return req


def materialize(srv, req, client="placer"):
    return srv.materialize(srv.parse_request(json.dumps(req)), client)


def device_usage(srv, client="ops"):
    return {d.device: d.in_use_bytes for d in srv.stats(client).devices}


def test_auto_is_best_fit(pool):
    # 40 MiB fits every device; the tightest is cpu:0 (64 MiB).
    a = materialize(pool, model(1, 36))
    assert a.device == "cpu:0"
    # 40 more no longer fits cpu:0: the next tightest is cpu:1.
    b = materialize(pool, model(1, 36))
    assert b.device == "cpu:1"
    assert device_usage(pool)["cpu:0"] == a.arena_bytes
    for h in (a.handle, b.handle):
        pool.release(h, "placer")
    pool.assert_idle("placer")


def test_split_fills_devices_in_order_and_bytes_match(pool):
    pb = pool.pb
    req = model(6, 40)  # 4 MiB embedding + 6 x 40 MiB: spans devices
    req["placement"] = {"device": "split", "split": {
        "maxMemory": {"cpu:0": "50MiB"}, "noSplit": ["layers.2", "layers.3"]}}
    plan = pool.stub.Plan(pool.parse_request(json.dumps(req), pb.PlanRequest),
                          metadata=pool.md("placer"), timeout=60)
    resp = materialize(pool, req)
    assert resp.device == plan.placement and "+" in resp.device
    info = pool.describe(resp.handle, "placer")
    device_of = {t.name: t.device for t in info.tensors}
    assert device_of == {t.name: t.device for t in plan.tensors}
    # Modules stay whole; the no_split prefixes keep both their modules
    # together; the tie lives with its root.
    assert device_of["layers.2.attn.weight"] == device_of["layers.2.mlp.weight"]
    assert device_of["head.weight"] == device_of["embed.weight"] == "cpu:0"
    # cpu:0 is capped at 50 MiB: the embedding and one 20 MiB module.
    on = device_usage(pool)
    assert 0 < on["cpu:0"] <= 50 * MIB
    assert sum(on.values()) == resp.arena_bytes
    used = sorted({d for d in device_of.values()})
    assert used == sorted(resp.device.split("+"))
    # The same model unsplit gives the same bytes (portable values do not
    # depend on the device).
    whole = pool.fetch(materialize(pool, model(6, 40), "whole").handle, "whole")
    assert pool.fetch(resp.handle, "placer") == whole
    pool.release(resp.handle, "placer")
    for h in pool.stub.ListHandles(pb.ListHandlesRequest(),
                                   metadata=pool.md("whole"), timeout=30).handles:
        pool.release(h.handle, "whole")
    pool.assert_idle("placer")
    pool.assert_idle("whole")


def test_split_that_fits_nowhere_is_resource_exhausted(pool):
    req = model(1, 600)  # 300 MiB modules: larger than any device
    req["placement"] = {"device": "split"}
    with pytest.raises(grpc.RpcError) as e:
        materialize(pool, req)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert '"layers.0.attn"' in e.value.details()
    pool.assert_idle("placer")


def test_bad_split_arguments(pool):
    for split, fragment in (({"devices": ["cpu:9"]}, "placement.split.devices"),
                            ({"maxMemory": {"cpu:1": "lots"}}, "max_memory")):
        req = model(1, 1)
        req["placement"] = {"device": "split", "split": split}
        with pytest.raises(grpc.RpcError) as e:
            materialize(pool, req)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in e.value.details()
    pool.assert_idle("placer")


def test_stats_add_up_per_client_and_device(pool):
    """The invariant: for every device, the clients' in-use bytes add up to
    the device's; an admin sees every client, a client only itself."""
    handles = [(materialize(pool, model(1, 8), c).handle, c)
               for c in ("a", "b", "b")]
    s = pool.stats("ops")
    per_device = {d.device: d.in_use_bytes for d in s.devices}
    summed = {}
    for c in s.clients:
        for d in c.devices:
            summed[d.device] = summed.get(d.device, 0) + d.in_use_bytes
    assert {k: v for k, v in per_device.items() if v} == \
        {k: v for k, v in summed.items() if v}
    assert sum(c.in_use_bytes for c in s.clients) == s.in_use_bytes
    assert sorted(c.client for c in pool.stats("a").clients) == ["a"]
    for h, c in handles:
        pool.release(h, c)
    pool.assert_idle("ops")


def test_quota_is_enforced_with_figures(tmp_path):
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"clients": {"small": {"totalBytes": "16MiB"}}}))
    with serverproc.running_server(extra_args=[f"--quota_file={quotas}"]) as srv:
        ok = materialize(srv, model(1, 8), "small")
        with pytest.raises(grpc.RpcError) as e:
            materialize(srv, model(1, 8), "small")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "16.00 MiB" in e.value.details() and "total quota" in e.value.details()
        # Another client is not limited by small's quota.
        other = materialize(srv, model(1, 8), "other")
        srv.release(ok.handle, "small")
        srv.release(other.handle, "other")
        srv.assert_idle("small")
