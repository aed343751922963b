"""--shm_dir: the tmpfs directory that exportable CPU arenas are files in
(server/memory/shm_file.h). In one mounted huge=always a co-located
trainer's weights arrive in 2 MiB pages, with the same values as through
/dev/shm; a directory that is not a writable tmpfs is refused when the
server starts, naming the flag and the reason."""

import os
import subprocess
import tempfile
import time

import pytest
import torch
import torch.nn as nn

import materializer as mz
import matutil
import serverproc


def start_fails(*args):
    proc = subprocess.run([serverproc.SERVER_BIN, "--listen=127.0.0.1:0",
                           "--devices=cpu", *args],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, proc.stderr
    return proc.stderr


def test_a_directory_that_is_not_a_writable_tmpfs_is_refused_at_startup(tmp_path):
    err = start_fails("--shm_dir=/proc")
    assert "--shm_dir: shared-memory directory /proc: not on a tmpfs" in err, err
    missing = str(tmp_path / "missing")
    err = start_fails(f"--shm_dir={missing}")
    assert f"--shm_dir: shared-memory directory {missing}: No such file" in err, err


@pytest.fixture(scope="module")
def huge_tmpfs():
    """A 512 MiB tmpfs mounted huge=always (as root; skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tempfile.mkdtemp(prefix="materializer-huge-")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m,huge=always,mode=1777",
         "tmpfs", where], capture_output=True, text=True)
    if mounted.returncode != 0:
        os.rmdir(where)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", where], check=False)  # mappings may outlive it
        os.rmdir(where)


def compact_memory():
    """Asks the kernel to defragment free memory (as root): tmpfs takes a
    2 MiB page only where one is free at that moment (with the usual THP
    defrag setting it does not compact for it), and while a build runs
    beside the tests free memory is in small pieces."""
    try:
        with open("/proc/sys/vm/compact_memory", "w") as f:
            f.write("1")
    except OSError:
        pass


def shmem_huge_bytes():
    """Bytes of tmpfs and shared memory held in 2 MiB pages, machine-wide."""
    return matutil.meminfo_bytes("ShmemHugePages")


def require_huge_pages(before, need):
    """Skips (does not pass) when the kernel gave the test's files fewer
    than `need` bytes of 2 MiB pages even after compaction: then the
    mapping cannot be checked here. Returns the bytes it gave."""
    got = shmem_huge_bytes() - before
    if got < need:
        pytest.skip(f"the kernel backed only {got} bytes of the tmpfs files with "
                    f"2 MiB pages (need {need}); free memory too fragmented")
    return got


def huge_mapped_bytes(begin, end):
    """Bytes of this process's mappings inside [begin, end) that are mapped
    with 2 MiB entries (ShmemPmdMapped in /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and hi > begin
            elif inside and line.startswith("ShmemPmdMapped:"):
                total += int(line.split()[1]) * 1024
    return total


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2048, 4096)      # 32 MiB of weights
        self.b = nn.Linear(4096, 1024)      # 16 MiB


def test_weights_arrive_in_huge_pages_with_the_dev_shm_values(huge_tmpfs, server):
    compact_memory()
    before = shmem_huge_bytes()
    with serverproc.running_server([f"--shm_dir={huge_tmpfs}"], log_level="info") as srv:
        with mz.meta_device():
            model = Wide()
        r = mz.materialize(model, server=srv.address, seed=11, transport="shm")
        assert r.transport == "shm"
        require_huge_pages(before, 48 << 20)
        params = list(model.parameters())
        begin = min(p.data_ptr() for p in params)
        end = max(p.data_ptr() + p.numel() * p.element_size() for p in params)
        huge = huge_mapped_bytes(begin, end)
        # 49 MiB of parameters: at least 46 MiB of whole 2 MiB pages.
        assert huge >= 46 << 20, f"only {huge} bytes mapped with 2 MiB pages"
        with open(srv.log_path) as f:
            log = f.read()
        assert f"shared memory in {huge_tmpfs}: 2 MiB pages" in log, log
        # The same values as the session server's /dev/shm files.
        with mz.meta_device():
            reference = Wide()
        mz.materialize(reference, server=server.address, seed=11, transport="shm")
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.detach(), q.detach()), name
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(2.0)                  # the trainer's first write
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.detach(), q.detach() * 2.0), name
        del model
        srv.assert_idle()


class Long(nn.Module):
    def __init__(self):
        super().__init__()
        # 160 MiB and 32 KiB: two pool slabs, and a size the kernel would not
        # place on a 2 MiB boundary by itself
        self.a = nn.Linear(8192, 5121, bias=False)


def test_pool_slabs_in_huge_pages_map_back_to_back_in_huge_pages(huge_tmpfs, server):
    """With a pool, the export is several files (128 MiB slabs); the SDK maps
    them into one range that it reserves on a 2 MiB boundary, so the
    trainer maps the slabs' huge pages with 2 MiB entries too."""
    args = [f"--shm_dir={huge_tmpfs}", "--shm_pool_bytes=256MiB", "--shm_pool_quiet=0s"]
    compact_memory()
    before = shmem_huge_bytes()
    with serverproc.running_server(args) as srv:
        deadline = time.monotonic() + 120
        while srv.stats("huge").shm_pool.bytes < 256 << 20:
            assert time.monotonic() < deadline, "the pool did not fill"
            time.sleep(0.05)
        with mz.meta_device():
            model = Long()
        r = mz.materialize(model, server=srv.address, seed=5, transport="shm")
        assert r.transport == "shm"
        assert srv.stats("huge").shm_pool.taken_bytes == 256 << 20  # both slabs
        require_huge_pages(before, 160 << 20)
        w = model.a.weight
        huge = huge_mapped_bytes(w.data_ptr(), w.data_ptr() + w.numel() * 4)
        assert huge >= 150 << 20, f"only {huge} bytes mapped with 2 MiB pages"
        with mz.meta_device():
            reference = Long()
        mz.materialize(reference, server=server.address, seed=5, transport="shm")
        assert torch.equal(w.detach(), reference.a.weight.detach())
        del model
