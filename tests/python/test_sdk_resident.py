"""load/resident.py: new CPU destination tensors are made resident without a
byte of them changing, also while another thread writes into them."""

import ctypes
import mmap
import sys
import threading

import pytest
import torch

from materializer.load import resident
from materializer.load.resident import PAGE, MakeResident

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or resident._MADVISE is None,
    reason="madvise is a Linux facility")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(t):
    """Fraction of the whole pages inside `t` that are mapped (mincore)."""
    addr, n = t.data_ptr(), t.numel() * t.element_size()
    lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE
    pages = (hi - lo) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    assert _libc.mincore(lo, hi - lo, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) / pages


def fresh_bytes(n):
    """A tensor over `n` bytes no process has touched yet. torch.empty cannot
    promise that: in a long test process the allocator hands back freed heap
    pages that are still mapped."""
    region = mmap.mmap(-1, n)
    t = torch.frombuffer(region, dtype=torch.uint8)
    t.region = region          # the mapping lives as long as the tensor
    return t


def kernel_populates():
    """MADV_POPULATE_WRITE exists from Linux 5.14 on."""
    probe = torch.empty(1 << 20, dtype=torch.uint8)
    addr = -(-probe.data_ptr() // PAGE) * PAGE
    return resident._MADVISE(addr, PAGE, resident.MADV_POPULATE_WRITE) == 0


def test_fresh_tensors_become_resident_and_keep_their_bytes():
    if not kernel_populates():
        pytest.skip("the kernel predates MADV_POPULATE_WRITE")
    big = fresh_bytes(48 << 20)
    small = torch.empty(300_000, dtype=torch.float32)
    assert resident_fraction(big) == 0.0                 # new: nothing mapped
    big[: 1 << 20] = 7                                   # bytes already there stay
    work = MakeResident([big, small, torch.empty(0)]).start()
    work.done()
    assert resident_fraction(big) == 1.0
    assert resident_fraction(small) == 1.0
    assert work.bytes_done >= (48 << 20) - 2 * PAGE
    assert bool((big[: 1 << 20] == 7).all())


def test_a_writer_running_alongside_keeps_every_byte_it_wrote():
    if not kernel_populates():
        pytest.skip("the kernel predates MADV_POPULATE_WRITE")
    dest = torch.empty(96 << 20, dtype=torch.uint8)
    pattern = torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8)
    work = MakeResident([dest])

    def write():
        for i in range(0, dest.numel(), pattern.numel()):
            dest[i:i + pattern.numel()].copy_(pattern)

    writer = threading.Thread(target=write)
    writer.start()
    work.start()
    writer.join()
    work.done()
    assert bool((dest.view(-1, pattern.numel()) == pattern).all())


def test_stop_ends_the_thread_early():
    dest = torch.empty(256 << 20, dtype=torch.uint8)
    work = MakeResident([dest]).start()
    work.stop()
    assert not work._thread.is_alive()
    assert work.bytes_done <= dest.numel()
