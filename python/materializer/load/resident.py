"""Making new CPU destination tensors resident before their bytes arrive.

A new tensor's pages are mapped on first write, one fault per 4 KiB page.
For a streamed model those faults are most of the trainer's CPU time: with
llama-1b's 4.4 GB of fresh tensors, the load phase spent about half of its
time faulting pages in (perf: clear_page and exc_page_fault under the copy
into the destinations), and touching the same tensors alone took 2.3-4.7 s
on a 2-core virtual machine (docs/python.md, "Where the time goes").

So the stream transport allocates its CPU destinations *before* asking the
server to materialize, and a background thread makes them resident while
the server works: the faults overlap the server's init instead of the
transfer. MADV_POPULATE_WRITE (Linux 5.14) maps the pages as if written,
without writing, so it can run while the copier already fills the same
tensors: a page the copier wrote is left as it is.

No huge-page hint (MADV_HUGEPAGE), here or in the server's arenas: on
the 2-core VM, first writes into advised ranges were fast in some runs
and up to 10x slower in others (under THP defrag "madvise" a fault in an
advised range waits until the kernel finds a free 2 MiB page, and the
trainer and the server draw on the same free pages). In same-run A/Bs of
llama-1b stream loads (4-6 alternating repetitions each), the load ran
at 2.69 GB/s without the hint against 0.72 with it (server without the
hint) and at 2.73 against 2.55 (server with it), and the materialize
phase, which this thread overlaps, took 9.4 s against 16.1
(docs/architecture.md, "Host memory").

Elsewhere (another OS, an older kernel, a refused call) nothing happens and
the copier faults the pages itself, as before. Only linux/CPU tensors are
touched; contents are never read or written here.
"""

import ctypes
import sys
import threading

PAGE = 4096
# One madvise call covers at most this much, so stop() is honoured promptly.
SLICE_BYTES = 64 << 20

MADV_POPULATE_WRITE = 23


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def _ranges(tensors):
    """(address, bytes) of each CPU tensor's memory, in the given order (the
    order the stream fills them, so this thread stays ahead of the copier);
    empty and non-CPU tensors are left out."""
    out = []
    for t in tensors:
        n = t.numel() * t.element_size()
        if n and t.device.type == "cpu":
            out.append((t.data_ptr(), n))
    return out


class MakeResident:
    """Makes `tensors` resident on a daemon thread. stop() ends it early
    (after the madvise call in progress); the tensors must stay alive until
    stop() or done() returned (the caller holds them)."""

    def __init__(self, tensors):
        self._ranges = _ranges(tensors)
        self._stop = threading.Event()
        self.bytes_done = 0
        self.supported = _MADVISE is not None
        self._thread = threading.Thread(target=self._run, name="materializer-resident",
                                        daemon=True)

    def start(self):
        if self.supported and self._ranges:
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def done(self):
        """Waits until every page is resident (or the kernel refused)."""
        if self._thread.is_alive():
            self._thread.join()

    def _run(self):
        for addr, n in self._ranges:
            if self._stop.is_set():
                return
            # Whole pages inside the tensor; the partial pages at its ends
            # are faulted by the copier.
            lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE
            while lo < hi:
                if self._stop.is_set():
                    return
                step = min(SLICE_BYTES, hi - lo)
                if _MADVISE(lo, step, MADV_POPULATE_WRITE) != 0:
                    # EINVAL before Linux 5.14: nothing to do but let the
                    # copier fault the pages. ENOMEM/EFAULT: the same.
                    return
                lo += step
                self.bytes_done += step
