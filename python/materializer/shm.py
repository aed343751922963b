"""Map a CPU export of materializerd as torch tensors, without copying.

ExportHandle on a handle materialized with `exportable: true` answers with a
SharedMemoryExport: a 0600 file under /dev/shm (the server's --shm_dir)
holding the handle's arena, and every tensor's offset in it. This module
maps that file into the calling process and views each tensor over the
mapping:

    exported = stub.ExportHandle(ExportRequest(handle=h), metadata=md)
    with shm.map_export(exported) as imported:
        for name, t in imported.tensors.items():
            ...                      # t shares memory with the server's arena
    stub.CloseExport(CloseExportRequest(export_id=exported.export_id), ...)

The mapping is read-only by default: the tensors are the server's bytes, and
an in-place op on them raises a segmentation fault. Pass writable=True for a
private copy-on-write mapping (pages are copied only when written, and the
writes stay in this process), or writable="shared" for the pages themselves,
mapped writable and populated: writes cost no copy and no fault, but until
the server releases the handle they change the server's bytes too, so this
is for a caller that releases the handle before it writes (the SDK's
default). "shared" needs write access to the file (the server's user);
where the file cannot be opened for writing it falls back to the private
mapping (`mode` says which one was made).

Lifetime: the mapping stays valid after the server releases the handle (the
file is unlinked then, and its memory goes when the last mapping goes).
close() drops this object's references; the pages are unmapped once no
tensor from it is left alive.

While the mapping lives, this process holds each file open with a shared
flock (closed with the mapping; a forked child shares it, as it shares
the mapping). The pages are charged to the server's memory, whoever maps
them, so the server keeps counting a released handle's bytes (GetStats
`handed_over_bytes`, against its capacity and the client's quota) until
no process holds the lock: a server that forgot them would admit new
handles into memory its cgroup no longer has.
"""

import collections
import fcntl
import mmap
import os
import warnings
import weakref

import torch

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MADV_POPULATE_READ = 22           # Linux 5.14
_POPULATE_THREADS = max(1, min(4, os.cpu_count() or 1))
_POPULATE_MIN_BYTES = 64 << 20     # below this one thread maps it as fast


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mmap.restype = ctypes.c_void_p
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap.restype = ctypes.c_int
        _LIBC = libc
    return _LIBC


_LIBC = None


def _populate_shared(address, size):
    """Maps every page of [address, address + size) now, on a few threads
    (ctypes releases the GIL), as MAP_POPULATE does on one: 4.4 GB took
    0.17 s on 2 threads against MAP_POPULATE's 0.27 s. A read populate maps
    16 pages per fault (fault-around), and a shared tmpfs mapping has no
    dirty tracking, so the entries are writable and the first write costs
    no fault (MADV_POPULATE_WRITE, one write fault per page, took 0.8 s).
    Returns False where the kernel lacks MADV_POPULATE_READ (5.14)."""
    import threading
    libc = _libc()
    page = mmap.PAGESIZE
    threads = _POPULATE_THREADS if size >= _POPULATE_MIN_BYTES else 1
    share = (size // threads + page - 1) // page * page
    failed = []

    def run(begin):
        end = min(size, begin + share)
        if end > begin and libc.madvise(address + begin, end - begin,
                                        _MADV_POPULATE_READ) != 0:
            failed.append(begin)

    workers = [threading.Thread(target=run, args=(t * share,)) for t in range(1, threads)]
    for w in workers:
        w.start()
    run(0)
    for w in workers:
        w.join()
    return not failed

_PROT_NONE, _PROT_READ, _PROT_WRITE = 0, 1, 2
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
_MAP_NORESERVE = 0x4000


def _check_segments(segments, size):
    """The segments must cover [0, size) back to back, each starting on a
    page (a file maps only at a page-aligned address)."""
    at = 0
    for seg_path, offset, nbytes in segments:
        if offset != at or (len(segments) > 1 and offset % mmap.PAGESIZE):
            raise ValueError(f"segment {seg_path} starts at {offset}, expected {at} "
                             f"(page-aligned)")
        at += nbytes
    if at != size:
        raise ValueError(f"the export's segments cover {at} bytes, not its {size}")


_HUGE_PAGE = 2 << 20


def _reserve(mapped):
    """Reserves `mapped` bytes of address space (PROT_NONE), starting on a
    2 MiB boundary when it is that large: the server's segments start at
    multiples of 2 MiB, and a file in a huge-page tmpfs (the server's
    --shm_dir) is mapped with 2 MiB pages only at an address aligned as
    its offset is. Returns the address, or None."""
    import ctypes
    libc = _libc()
    flags = _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE
    failed = (None, ctypes.c_void_p(-1).value)
    if mapped < _HUGE_PAGE:
        base = libc.mmap(None, mapped, _PROT_NONE, flags, -1, 0)
        return None if base in failed else base
    padded = mapped + _HUGE_PAGE
    start = libc.mmap(None, padded, _PROT_NONE, flags, -1, 0)
    if start in failed:
        return None
    base = (start + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
    if base > start:
        libc.munmap(start, base - start)
    if start + padded > base + mapped:
        libc.munmap(base + mapped, start + padded - (base + mapped))
    return base


def _map_segments(fds, segments, size, mode):
    """Maps each segment's file at its offset of one reserved range and
    returns a buffer over the range; the range is unmapped when the last
    tensor viewing it goes (torch.frombuffer keeps the buffer alive)."""
    import ctypes
    import weakref
    libc = _libc()
    page = mmap.PAGESIZE
    mapped = (size + page - 1) // page * page
    base = _reserve(mapped)
    if base is None:
        raise OSError(ctypes.get_errno(), f"reserving {size} bytes of address space")
    prot = _PROT_READ if mode == "read-only" else _PROT_READ | _PROT_WRITE
    flags = (_MAP_PRIVATE if mode == "private" else _MAP_SHARED) | _MAP_FIXED
    try:
        for fd, (seg_path, offset, nbytes) in zip(fds, segments):
            if nbytes == 0:
                continue
            length = (nbytes + page - 1) // page * page
            got = libc.mmap(base + offset, length, prot, flags, fd, 0)
            if got != base + offset:
                raise OSError(ctypes.get_errno(), f"mapping {seg_path}")
    except BaseException:
        libc.munmap(base, mapped)
        raise
    buffer = (ctypes.c_uint8 * size).from_address(base)
    weakref.finalize(buffer, libc.munmap, base, mapped)
    return buffer


_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "complex64": torch.complex64,
}


class SharedMemoryImport:
    """An ExportResponse's shared memory mapped into this process.

    `tensors`: an OrderedDict name -> torch.Tensor in the export's order,
    each a view of the mapping. `base`: a uint8 tensor over the whole arena.
    """

    def __init__(self, export, writable=False):
        if not export.HasField("shared_memory"):
            raise ValueError(
                "this export is not shared memory (a CUDA export needs "
                "torch.cuda and the C++ helper client/export_import.h)")
        path = export.shared_memory.path
        size = int(export.arena_bytes)
        segments = [(s.path, int(s.offset), int(s.bytes))
                    for s in export.shared_memory.segments]
        if not segments:   # a server from before segments: one file
            segments = [(path, 0, size)]
        _check_segments(segments, size)
        fds = []
        populate = False
        self.mode = "read-only" if not writable else "private"
        try:
            if writable == "shared":
                try:
                    for seg_path, _, _ in segments:
                        fds.append(os.open(seg_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW))
                    self.mode = "shared"
                except PermissionError:
                    for fd in fds:   # another user's file: copy-on-write instead
                        os.close(fd)
                    fds = []
            if not fds:
                for seg_path, _, _ in segments:
                    fds.append(os.open(seg_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW))
            for fd, (seg_path, _, seg_bytes) in zip(fds, segments):
                if os.fstat(fd).st_size < seg_bytes:
                    raise ValueError(f"{seg_path} is smaller than the export's "
                                     f"{seg_bytes} bytes there")
                # Taken before the mapping, so the server sees it at any
                # release that comes after this call.
                fcntl.flock(fd, fcntl.LOCK_SH)
            if size == 0:
                self._map = None
            elif len(segments) > 1:
                # Several files (a server's shared-memory pool): mapped back
                # to back into one reserved range.
                self._map = _map_segments(fds, segments, size, self.mode)
                populate = self.mode == "shared"
            elif self.mode == "shared":
                # Populated now: the pages are the server's, already
                # resident, so this maps them without a fault per page, on
                # several threads (MAP_POPULATE would be one).
                self._map = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED,
                                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
                populate = True
            elif self.mode == "private":
                self._map = mmap.mmap(fds[0], size, flags=mmap.MAP_PRIVATE,
                                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
            else:
                self._map = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED,
                                      prot=mmap.PROT_READ)
            if self._map is not None:
                # The descriptors (and their locks) live as long as the
                # mapping: torch.frombuffer keeps the map object alive.
                weakref.finalize(self._map, _close_all, list(fds))
                fds = []
        finally:
            _close_all(fds)
        self.segments = segments
        self.path = path
        self.export_id = export.export_id
        self.size = size
        if self._map is None:
            self.base = torch.empty(0, dtype=torch.uint8)
        else:
            with warnings.catch_warnings():
                # A read-only buffer: torch warns that writes would be
                # undefined; they fault, as documented above.
                warnings.simplefilter("ignore", UserWarning)
                self.base = torch.frombuffer(self._map, dtype=torch.uint8)
            if populate and not _populate_shared(self.base.data_ptr(), size):
                # An older kernel: ask for read-ahead instead.
                _libc().madvise(self.base.data_ptr(), size, mmap.MADV_WILLNEED)
        self.tensors = collections.OrderedDict()
        for t in export.tensors:
            dtype = _DTYPES.get(t.dtype)
            if dtype is None:
                raise ValueError(f"tensor {t.name}: unknown dtype {t.dtype}")
            shape = [int(s) for s in t.shape]
            if t.offset + t.nbytes > size:
                raise ValueError(f"tensor {t.name} lies outside the export")
            if t.nbytes == 0:
                self.tensors[t.name] = torch.empty(shape, dtype=dtype)
                continue
            raw = self.base[t.offset:t.offset + t.nbytes]
            self.tensors[t.name] = raw.view(dtype).reshape(shape)

    def address(self):
        """Address of the mapping's first byte (0 for an empty export)."""
        return self.base.data_ptr() if self.size else 0

    def close(self):
        """Drops this object's references. The mapping itself goes when the
        last tensor viewing it goes (torch.frombuffer keeps the mmap object
        alive; closing it explicitly would unmap memory that live tensors
        still point at)."""
        self.tensors = collections.OrderedDict()
        self.base = None
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def map_export(export, writable=False):
    """Maps `export` (an ExportResponse with shared_memory). writable:
    False (read-only), True (private copy-on-write) or "shared" (see the
    module docstring)."""
    return SharedMemoryImport(export, writable=writable)
