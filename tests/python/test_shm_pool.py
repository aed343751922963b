"""The shared-memory pool (--shm_pool_bytes, server/memory/shm_pool.h): an
exportable arena is built from files the server made resident while idle.
What a trainer gets must not change: the same values as fresh pages, every
segment of the export covering the arena back to back, the files gone at
release, and the pool visible in GetStats and /metrics."""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import torch
import torch.nn as nn

import materializer as mz
import scrape
import serverproc
from materializer import digest, shm
from test_matctl_identity import matctl

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


def export_and_check(srv, h):
    """Exports handle `h`, maps it as one range and checks that its tensors
    hold what the server's digests say; closes the export, returns it."""
    info = srv.describe(h, client=CLIENT)
    exported = srv.stub.ExportHandle(srv.pb.ExportRequest(handle=h),
                                     metadata=srv.md(CLIENT), timeout=60)
    with shm.map_export(exported) as imported:
        assert {n: digest.of_tensor(t) for n, t in imported.tensors.items()} == \
            {t.name: t.digest for t in info.tensors}
    srv.stub.CloseExport(srv.pb.CloseExportRequest(export_id=exported.export_id),
                         metadata=srv.md(CLIENT), timeout=60)
    return exported


def test_export_is_the_pool_files_back_to_back_and_they_go_at_release(srv):
    before = wait_full(srv)
    assert before.target_bytes == POOL
    # 300 MiB: two whole slabs and a third cut to the 44 MiB left.
    h = srv.materialize(request(srv, 300), client=CLIENT).handle
    taken = srv.stats(CLIENT).shm_pool.taken_bytes - before.taken_bytes
    assert taken == 3 * SLAB
    exported = export_and_check(srv, h)
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
    assert scrape.value(samples, "materializer_shm_pool_max_bytes") == POOL
    assert scrape.value(samples, "materializer_shm_pool_trimmed_bytes_total") == 0
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


def wait_for(what, done, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def shm_dir():
    """A directory of the test's own on the /dev/shm tmpfs, so that the
    pool's files can be counted."""
    d = tempfile.mkdtemp(prefix="mz-pool-", dir="/dev/shm")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pool_files(d):
    return sorted(n for n in os.listdir(d) if n.startswith("materializer-"))


def test_the_default_pool_learns_its_size_from_exports_and_frees_it_unused(shm_dir):
    """With no --shm_pool_bytes the pool is adaptive: empty until an export
    asks for memory, then as large as that burst asked for, so the next
    export of the same model gets resident pages; unused for
    --shm_pool_release_after it frees everything."""
    with serverproc.running_server(
            ["--shm_pool_quiet=0s", "--shm_pool_release_after=8s",
             f"--shm_dir={shm_dir}"], shm_pool=None) as srv:
        pool = srv.stats(CLIENT).shm_pool
        assert pool.adaptive
        assert pool.max_bytes >= SLAB
        assert (pool.target_bytes, pool.bytes) == (0, 0)
        shown = matctl(f"--server={srv.address}", f"--client={CLIENT}", "stats")
        assert shown.returncode == 0, shown.stderr
        assert "shared-memory pool: 0 B resident, target 0 B (adaptive, up to " \
            in shown.stdout, shown.stdout
        time.sleep(1.0)
        assert pool_files(shm_dir) == []          # a node that never exports

        # The first export finds the pool empty and gets fresh pages...
        h = srv.materialize(request(srv, 300), client=CLIENT).handle
        assert srv.stats(CLIENT).shm_pool.taken_bytes == 0
        assert srv.release(h, client=CLIENT).released
        # ...and teaches the pool its size: three slabs (300 MiB).
        wait_for("the pool to learn three slabs",
                 lambda: srv.stats(CLIENT).shm_pool.bytes == 3 * SLAB)
        assert srv.stats(CLIENT).shm_pool.target_bytes == 3 * SLAB
        assert len(pool_files(shm_dir)) == 3

        # The second export of that size is built from the pool's slabs and
        # holds what the server's digests say.
        h = srv.materialize(request(srv, 300), client=CLIENT).handle
        assert srv.stats(CLIENT).shm_pool.taken_bytes == 3 * SLAB
        assert len(export_and_check(srv, h).shared_memory.segments) == 3
        assert srv.release(h, client=CLIENT).released
        wait_for("the refill", lambda: srv.stats(CLIENT).shm_pool.bytes == 3 * SLAB)

        # Unused for 8 s, it gives everything back and stays empty.
        taken_at = time.monotonic()
        wait_for("the unused pool to be freed",
                 lambda: srv.stats(CLIENT).shm_pool.bytes == 0
                 and pool_files(shm_dir) == [], timeout=30)
        assert time.monotonic() - taken_at >= 3
        pool = srv.stats(CLIENT).shm_pool
        assert pool.target_bytes == 0
        assert pool.trimmed_bytes == 3 * SLAB
        assert pool_files(shm_dir) == []
        time.sleep(1.5)
        assert srv.stats(CLIENT).shm_pool.bytes == 0
        srv.assert_idle(CLIENT)


def test_the_pool_and_the_arenas_share_the_cpu_capacity(shm_dir):
    """The pool's slabs are host memory: with --cpu_capacity=1GiB a client
    that reserves 512 MiB gets it even though the pool held 768 MiB, the
    pool giving back what no longer fits; together they never pass the
    capacity, and the pool refills when the client releases."""
    with serverproc.running_server(
            [f"--shm_pool_bytes={6 * SLAB}", "--shm_pool_quiet=0s",
             f"--shm_dir={shm_dir}"], cpu_capacity="1GiB") as srv:
        wait_full(srv)
        assert srv.stats(CLIENT).shm_pool.bytes == 6 * SLAB
        req = request(srv, 512)
        req.model.tensors.pop()           # exactly 512 MiB + 66 bytes
        req.exportable = False            # private memory, not the pool's
        h = srv.materialize(req, client=CLIENT).handle
        pool = srv.stats(CLIENT).shm_pool
        assert pool.bytes <= 1024 * MIB - 513 * MIB, pool
        assert pool.bytes == 3 * SLAB
        assert pool.trimmed_bytes == 3 * SLAB
        time.sleep(1.5)                   # the refill stays within the room
        assert srv.stats(CLIENT).shm_pool.bytes == 3 * SLAB
        assert len(pool_files(shm_dir)) == 3
        assert srv.release(h, client=CLIENT).released
        wait_full(srv)
        assert len(pool_files(shm_dir)) == 6
