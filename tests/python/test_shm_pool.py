"""The shared-memory pool (--shm_pool_bytes, server/memory/shm_pool.h): an
exportable arena is built from files the server made resident while idle.
What a trainer gets must not change: the same values as fresh pages, every
segment of the export covering the arena back to back, the files gone at
release, and the pool visible in GetStats and /metrics."""

import json
import os
import subprocess
import time

import pytest
import torch
import torch.nn as nn

import materializer as mz
import scrape
import serverproc
from materializer import digest, shm

CLIENT = "pool-test"
MIB = 1 << 20
SLAB = 128 * MIB          # server/memory/shm_pool.h
POOL = 4 * SLAB


@pytest.fixture(scope="module")
def srv():
    with serverproc.running_server(
            [f"--shm_pool_bytes={POOL}", "--shm_pool_quiet=0s",
             "--metrics_listen=127.0.0.1:0"], log_level="info") as s:
        yield s


def wait_full(srv, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = srv.stats(CLIENT).shm_pool
        if pool.bytes == pool.target_bytes:
            return pool
        time.sleep(0.05)
    raise AssertionError(f"the pool did not refill: {srv.stats(CLIENT).shm_pool}")


def request(srv, mib):
    """`mib` MiB of float32 plus two small tensors, exportable."""
    req = srv.parse_request(json.dumps({"model": {"tensors": [
        {"name": "w", "shape": [mib, 256, 1024], "dtype": "float32"},
        {"name": "b", "shape": [33], "dtype": "bfloat16"},
        {"name": "tail", "shape": [5, 7], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"normal": {"std": 2}}}],
        "seed": "3"}}))
    req.exportable = True
    return req


def test_export_is_the_pool_files_back_to_back_and_they_go_at_release(srv):
    before = wait_full(srv)
    assert before.target_bytes == POOL
    # 300 MiB: two whole slabs and a third cut to the 44 MiB left.
    h = srv.materialize(request(srv, 300), client=CLIENT).handle
    taken = srv.stats(CLIENT).shm_pool.taken_bytes - before.taken_bytes
    assert taken == 3 * SLAB
    info = srv.describe(h, client=CLIENT)
    exported = srv.stub.ExportHandle(srv.pb.ExportRequest(handle=h),
                                     metadata=srv.md(CLIENT), timeout=60)
    segments = exported.shared_memory.segments
    assert len(segments) == 3
    assert exported.shared_memory.path == segments[0].path
    at = 0
    for s in segments:
        assert s.offset == at
        at += s.bytes
        st = os.stat(s.path)
        assert st.st_size == s.bytes
        assert st.st_mode & 0o777 == 0o600
        assert os.path.basename(s.path).startswith("materializer-")
    assert at == exported.arena_bytes
    assert [s.bytes for s in segments[:2]] == [SLAB, SLAB]

    # Mapped as one range, the tensors hold what the server's digests say.
    with shm.map_export(exported) as imported:
        assert {n: digest.of_tensor(t) for n, t in imported.tensors.items()} == \
            {t.name: t.digest for t in info.tensors}
    srv.stub.CloseExport(srv.pb.CloseExportRequest(export_id=exported.export_id),
                         metadata=srv.md(CLIENT), timeout=60)
    assert srv.release(h, client=CLIENT).released
    for s in segments:
        assert not os.path.exists(s.path), f"{s.path} outlived its handle"
    srv.assert_idle(CLIENT)
    # And the pool fills again.
    assert wait_full(srv).filled_bytes >= before.filled_bytes + 3 * SLAB


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4096, 8192)      # 128 MiB of weight
        self.b = nn.Linear(8192, 4096)      # and another
        self.ln = nn.LayerNorm(4096)
        self.head = nn.Linear(4096, 3000, bias=False)


def test_sdk_weights_from_the_pool_equal_fresh_pages_and_are_writable(srv):
    """The SDK's default co-located path (shared memory, pages handed to
    the trainer) gives the same bits as the stream transport, whose arena is
    fresh private memory; and the trainer writes them."""
    wait_full(srv)
    taken = srv.stats(CLIENT).shm_pool.taken_bytes
    with torch.device("meta"):
        pooled, fresh = Wide(), Wide()
    r = mz.materialize(pooled, server=srv.address, seed=21, transport="shm")
    assert r.transport == "shm"
    assert srv.stats(CLIENT).shm_pool.taken_bytes - taken >= 2 * SLAB
    mz.materialize(fresh, server=srv.address, seed=21, transport="stream")
    for (name, p), q in zip(pooled.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(p, q), name
    with torch.no_grad():
        for p in pooled.parameters():
            p.add_(1)     # the first optimizer step's writes
    for (name, p), q in zip(pooled.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(p, q + 1), name


def test_pool_figures_in_metrics(srv):
    pool = wait_full(srv)
    samples = scrape.scrape(scrape.metrics_url(srv))
    assert scrape.value(samples, "materializer_shm_pool_target_bytes") == POOL
    assert scrape.value(samples, "materializer_shm_pool_bytes") == pool.bytes
    assert scrape.value(samples, "materializer_shm_pool_taken_bytes_total") >= 3 * SLAB
    assert scrape.value(samples, "materializer_shm_pool_filled_bytes_total") >= \
        POOL + 3 * SLAB


@pytest.mark.parametrize("value", ["1MiB", "lots"])
def test_a_bad_pool_size_is_refused_at_start(value):
    r = subprocess.run([serverproc.SERVER_BIN, "--listen=127.0.0.1:0", "--devices=cpu",
                        f"--shm_pool_bytes={value}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--shm_pool_bytes" in r.stderr, r.stderr
