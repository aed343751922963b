"""Streaming a handle into destination tensors.

The handle is fetched in the raw format (tensor bytes back to back, each
at a 64-byte boundary, in the handle's order: docs/delivery.md), whose
layout follows from the spec, so no DescribeFile is needed; the stream's
total size checks it. Each chunk is
copied straight into the destination tensors' storage: no per-tensor
buffer, no file, no second copy of the model. CUDA destinations receive
through pinned staging buffers (a ring of them, host-to-device copies
overlapping the network) on a side stream.

Verifying asks for the tensors' digests (FETCH_DIGEST_TENSORS) rather than
the file's: the server then hashes nothing while it streams (it has the
tensors' digests from one parallel pass per handle), and the receiver
hashes each tensor's bytes as they arrive.
"""

import logging
import queue
import threading
import time

import grpc
import numpy as np
import torch

from materializer.client.direct import Unsupported
from materializer.errors import LoadError, RpcError

log = logging.getLogger("materializer")

RAW_ALIGN = 64
# Received chunks waiting to be copied (each up to 4 MiB).
QUEUE = 8


def raw_layout(spec):
    """[(name, offset, nbytes)] of the raw file of `spec`'s handle fetched
    with ties excluded and non-persistent buffers included; and its size."""
    out = []
    pos = 0
    for t in spec.tensors:
        if t.tie_to:
            continue
        pos = -(-pos // RAW_ALIGN) * RAW_ALIGN
        out.append((t.name, pos, t.nbytes))
        pos += t.nbytes
    return out, pos


def glob_escape(name):
    """A glob that matches exactly `name` (init-rule glob syntax)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


def fetch_fields(spec, names=None, tensor_digests=True):
    """FetchRequest fields for the raw layout above (of all roots, or of
    the roots `names`, in the spec's order); with tensor_digests, the
    stream ends with every tensor's digest instead of the file's."""
    from materializer._proto import pb
    fields = dict(format=pb.WEIGHT_FORMAT_RAW, include_non_persistent=True)
    if tensor_digests:
        fields["digest"] = pb.FETCH_DIGEST_TENSORS
    if names is not None:
        fields["include"] = [glob_escape(n) for n in names]
    else:
        fields["exclude"] = [glob_escape(t.name) for t in spec.tensors if t.tie_to]
    return fields


def partition(spec, parts):
    """The roots of `spec` in `parts` groups of about equal bytes (each
    group's names in the spec's order), for parallel streams."""
    sizes = [0] * parts
    groups = [[] for _ in range(parts)]
    order = {t.name: i for i, t in enumerate(spec.tensors)}
    for t in sorted(spec.roots, key=lambda t: -t.nbytes):
        i = sizes.index(min(sizes))
        groups[i].append(t.name)
        sizes[i] += t.nbytes
    return [sorted(g, key=order.get) for g in groups if g]


class _Walk:
    """A raw file's layout, [(name, start, nbytes)] sorted by start, read
    with offsets that never go back (a stream, or its resumption): entries
    that end before an offset are passed for good."""

    def __init__(self, layout):
        self.entries = sorted(layout, key=lambda e: e[1])
        self.i = 0

    def first(self, offset):
        """The index of the first entry that ends after `offset`."""
        e = self.entries
        while self.i < len(e) and e[self.i][1] + e[self.i][2] <= offset:
            self.i += 1
        return self.i

    def overlaps(self, offset, end):
        """(index, name, start, lo, hi) for each entry holding file bytes
        [lo, hi) of [offset, end), in file order."""
        e = self.entries
        j = self.first(offset)
        while j < len(e) and e[j][1] < end:
            name, start, nbytes = e[j]
            lo, hi = max(start, offset), min(start + nbytes, end)
            if hi > lo:
                yield j, name, start, lo, hi
            j += 1


class _Sink:
    """Copies file byte ranges into destination tensors.

    Copies go through NumPy views of the destinations (np.copyto: a memcpy
    that releases the GIL); for small slices torch's copy_ costs more in
    dispatch than in bytes."""

    def __init__(self, layout, dests, device, staging_bytes):
        self.walk = _Walk(layout)
        self.layout = self.walk.entries
        self.cuda = torch.device(device).type == "cuda"
        self.flat = {}
        for name, _, nbytes in self.layout:
            d = dests[name]
            if d.numel() * d.element_size() != nbytes:
                raise LoadError(f"{name}: destination holds {d.numel() * d.element_size()} "
                                f"bytes, the handle {nbytes}")
            if not d.is_contiguous():
                raise LoadError(f"{name}: destination is not contiguous")
            if not nbytes:
                self.flat[name] = None
            elif self.cuda:
                self.flat[name] = d.reshape(-1).view(torch.uint8)
            else:
                self.flat[name] = d.reshape(-1).view(torch.uint8).numpy()
        self.scratch = bytearray(RAW_ALIGN)
        if self.cuda:
            self.stream = torch.cuda.Stream(device=device)
            self.ring = [torch.empty(staging_bytes, dtype=torch.uint8, pin_memory=True)
                         for _ in range(3)]
            self.ring_np = [r.numpy() for r in self.ring]
            self.events = [None] * len(self.ring)
            self.slot = 0

    def write(self, offset, data):
        """data: a bytes-like object holding file bytes [offset, offset+len)."""
        n = len(data)
        if not n:
            return
        src = np.frombuffer(data, dtype=np.uint8)
        if self.cuda:
            slot = self.slot
            self.slot = (slot + 1) % len(self.ring)
            if self.events[slot] is not None:
                self.events[slot].synchronize()
            np.copyto(self.ring_np[slot][:n], src)
            staged = self.ring[slot][:n]
        for _, name, start, lo, hi in self.walk.overlaps(offset, offset + n):
            dst = self.flat[name][lo - start:hi - start]
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    dst.copy_(staged[lo - offset:hi - offset], non_blocking=True)
            else:
                np.copyto(dst, src[lo - offset:hi - offset])
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.stream)
            self.events[slot] = ev

    def views(self, offset, n):
        """Writable memoryviews, n bytes together, of where file bytes
        [offset, offset+n) go (CPU destinations): slices of the destination
        tensors, and of a scratch buffer for the alignment padding between
        them. The direct receiver fills them straight from the socket."""
        out = []
        end = offset + n
        layout = self.layout
        pos = offset
        j = self.walk.first(offset)
        while pos < end:
            if j < len(layout) and layout[j][1] <= pos:
                name, start, nbytes = layout[j]
                hi = min(start + nbytes, end)
                if hi > pos:
                    out.append(memoryview(self.flat[name][pos - start:hi - start]))
                    pos = hi
                j += 1
                continue
            gap_end = min(end, layout[j][1] if j < len(layout) else end)
            if len(self.scratch) < gap_end - pos:
                self.scratch = bytearray(gap_end - pos)
            out.append(memoryview(self.scratch)[:gap_end - pos])
            pos = gap_end
        return out

    def finish(self):
        if self.cuda:
            self.stream.synchronize()


def load_stream(client, handle, spec, dests, device="cpu", progress=None,
                verify=True, chunk_bytes=0, streams=1):
    """Fetches `handle` (materialized from `spec`) into `dests` ({root
    name: contiguous tensor of the local shape}). progress: a tqdm-like
    object with update(n), or None. verify: hash each tensor's received
    bytes and compare with the digest the stream ends with (XXH3-128, one
    per tensor: _Verifier). streams: parallel fetch
    streams, each on its own connection, each for a part of the tensors
    (groups of about equal bytes). Returns the bytes received.

    The streams run on worker threads; this thread only waits, so that a
    Ctrl-C lands here, cancels them and propagates (never inside gRPC)."""
    if streams <= 1 or len(spec.roots) < 2:
        layout, total = raw_layout(spec)
        jobs = [(layout, total, fetch_fields(spec), 0)]
    else:
        jobs = []
        for lane, names in enumerate(partition(spec, streams)):
            wanted = set(names)
            layout, total = raw_layout(_Names([t for t in spec.tensors if t.name in wanted]))
            jobs.append((layout, total, fetch_fields(spec, names), lane))
    direct = torch.device(device).type == "cpu"
    loads = [(_DirectLoad if direct else _StreamLoad)(
                 client, handle, layout, total, fields, dests, device, progress, verify,
                 chunk_bytes, lane)
             for layout, total, fields, lane in jobs]
    for load in loads:
        load.start()
    try:
        for load in loads:
            load.wait()
    except BaseException:
        for load in loads:
            load.cancel()
        raise
    return sum(load.received for load in loads)


def _check_complete(load):
    """Raises unless `load` (a finished _StreamLoad or _DirectLoad) received
    every byte of its file and, when it hashed them, each tensor's digest."""
    if load.received != load.total:
        raise LoadError(f"handle {load.handle}: the stream ended at {load.received} "
                        f"of {load.total} bytes")
    if load.verifier is not None:
        load.verifier.check(load.digest)


# The last handle whose load was logged as not verified: the parallel
# streams of one load check one after another on the loading thread.
_unverified_handle = None


class _Verifier:
    """Hashes the tensors of a raw file with `layout` as its bytes arrive
    (in file order, in pieces of any size; one XXH3-128 per tensor, the
    padding between tensors left out) and compares them with the digests
    the stream ends with (FETCH_DIGEST_TENSORS)."""

    def __init__(self, handle, layout):
        import xxhash
        self.handle = handle
        self.walk = _Walk(layout)
        self.layout = self.walk.entries
        self.hashers = [xxhash.xxh3_128() for _ in self.layout]
        self.sent = {}        # name -> the stream's digest

    def update(self, offset, data):
        """data: a memoryview (or bytes) of file bytes [offset, offset+len)."""
        for j, _, _, lo, hi in self.walk.overlaps(offset, offset + len(data)):
            self.hashers[j].update(data[lo - offset:hi - offset])

    def add(self, tensor_digests):
        """The (name, digest) pairs of a chunk. A resumed stream sends them
        all again; the same pair twice is fine, two values for a name not."""
        for name, digest in tensor_digests:
            seen = self.sent.setdefault(name, digest)
            if seen != digest:
                raise LoadError(f"handle {self.handle}: the stream sent two digests for "
                                f"tensor {name!r}, {seen} and {digest}")

    def check(self, file_digest=""):
        """Raises LoadError naming the first tensor whose bytes do not match
        its digest, that got no digest, or a digest naming no tensor of the
        layout. A stream that carried a file digest and no tensor digests
        came from a server that does not know FETCH_DIGEST_TENSORS: nothing
        was checked, which is logged, not raised (once per handle, not once
        per parallel stream)."""
        global _unverified_handle
        if not self.sent and file_digest:
            if self.handle == _unverified_handle:
                return
            _unverified_handle = self.handle
            log.warning("materializer: handle %s: the server sent a file digest, not the "
                        "tensors' digests (an older server); the received bytes were not "
                        "verified", self.handle)
            return
        names = {e[0] for e in self.layout}
        for name in self.sent:
            if name not in names:
                raise LoadError(f"handle {self.handle}: the stream sent a digest for {name!r}, "
                                "which is not a tensor of this load")
        for (name, _, _), hasher in zip(self.layout, self.hashers):
            theirs = self.sent.get(name)
            if theirs is None:
                raise LoadError(f"handle {self.handle}: the stream sent no digest for tensor "
                                f"{name!r}")
            mine = "xxh3-128:" + hasher.hexdigest()
            if mine != theirs:
                raise LoadError(f"handle {self.handle}: tensor {name!r}: the received bytes hash "
                                f"to {mine}, the server's tensor to {theirs}")


class _Names:
    """The part of a spec a parallel stream fetches (raw_layout's input)."""

    def __init__(self, tensors):
        self.tensors = tensors


class _StreamLoad:
    """One FetchWeights stream of a raw file with `layout` into `dests`, on
    two threads: a receiver (gRPC; checks the framing) and a copier (copies
    each chunk into place and hashes it), so that receiving the next chunk
    overlaps copying the last (both release the GIL for the bytes). At most
    QUEUE chunks wait in between."""

    def __init__(self, client, handle, layout, total, fields, dests, device, progress,
                 verify, chunk_bytes, lane):
        self.handle = handle
        self.total = total
        self.sink = _Sink(layout, dests, device, max(chunk_bytes, 4 << 20))
        self.stream = client.fetch(handle, chunk_bytes=chunk_bytes, lane=lane, **fields)
        self.progress = progress
        self.verifier = _Verifier(handle, layout) if verify else None
        self.work = queue.Queue(maxsize=QUEUE)
        self.errors = []
        self.received = 0
        self.digest = ""
        self.done = threading.Event()
        self.receiver = threading.Thread(target=self._receive, name="materializer-fetch",
                                         daemon=True)
        self.copier = threading.Thread(target=self._copy, name="materializer-load",
                                       daemon=True)

    def start(self):
        self.copier.start()
        self.receiver.start()

    def cancel(self):
        self.errors.append(LoadError(f"handle {self.handle}: loading was cancelled"))
        self.stream.cancel()

    def wait(self):
        """Waits for the end; raises what went wrong."""
        # Short waits: a Ctrl-C is handled between two of them even when
        # the kernel delivered the signal to another thread of the process.
        while not self.done.wait(0.25):
            pass
        if self.errors:
            raise self.errors[0]
        self.sink.finish()
        _check_complete(self)

    def _receive(self):
        try:
            for chunk in self.stream:
                if chunk.total_bytes != self.total:
                    raise LoadError(f"handle {self.handle}: the raw file is {chunk.total_bytes} "
                                    f"bytes, the spec's layout {self.total}; the handle does "
                                    "not hold this spec")
                if chunk.offset != self.received:
                    raise LoadError(f"handle {self.handle}: chunk at {chunk.offset}, "
                                    f"expected {self.received}")
                if self.errors:
                    break
                if len(chunk.data):
                    self.work.put((chunk.offset, chunk.data))
                    self.received += len(chunk.data)
                if chunk.digest:
                    self.digest = chunk.digest
                if chunk.tensor_digests and self.verifier is not None:
                    self.verifier.add(chunk.tensor_digests)
        except BaseException as e:  # noqa: BLE001 - wait() raises it
            self.errors.append(e)
        finally:
            self.work.put(None)
            self.copier.join()
            self.done.set()

    def _copy(self):
        try:
            while True:
                item = self.work.get()
                if item is None:
                    return
                offset, data = item
                self.sink.write(offset, data)
                if self.verifier is not None:
                    self.verifier.update(offset, data)
                if self.progress is not None:
                    self.progress.update(len(data))
        except BaseException as e:  # noqa: BLE001 - wait() raises it
            self.errors.append(e)
            while self.work.get() is not None:   # drain: the receiver never blocks
                pass


class _DirectLoad:
    """One FetchWeights stream of a raw file with `layout` into CPU `dests`,
    received by client/direct.py straight into the destination tensors on
    one thread (the kernel's copy is the only one; the thread hashes each
    piece right after it arrived, while it is in cache). When the client
    does not fetch directly, or the connection cannot (Unsupported, before
    the first data byte), it loads through grpcio (_StreamLoad) instead. A
    stream that breaks (UNAVAILABLE) resumes from the next byte, up to the
    client's `retries` times."""

    def __init__(self, client, handle, layout, total, fields, dests, device, progress,
                 verify, chunk_bytes, lane):
        self.args = (client, handle, layout, total, fields, dests, device, progress, verify,
                     chunk_bytes, lane)
        self.client = client
        self.handle = handle
        self.total = total
        self.fields = dict(fields, chunk_bytes=chunk_bytes) if chunk_bytes else dict(fields)
        self.sink = _Sink(layout, dests, device, 0)
        self.progress = progress
        self.verifier = _Verifier(handle, layout) if verify else None
        self.errors = []
        self.received = 0
        self.digest = ""
        self.transport = None     # "direct" or "grpcio", once known
        self.lock = threading.Lock()
        self.fetch = None         # the DirectFetch in progress; guarded by lock
        self.fallback = None      # the _StreamLoad used instead; guarded by lock
        self.cancelled = False    # guarded by lock
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="materializer-direct",
                                       daemon=True)

    def start(self):
        self.thread.start()

    def cancel(self):
        with self.lock:
            self.cancelled = True
            fetch, fallback = self.fetch, self.fallback
        self.errors.append(LoadError(f"handle {self.handle}: loading was cancelled"))
        if fetch is not None:
            fetch.cancel()
        if fallback is not None:
            fallback.cancel()

    def wait(self):
        while not self.done.wait(0.25):
            pass
        if self.errors:
            raise self.errors[0]
        if self.fallback is not None:
            return
        _check_complete(self)

    def _run(self):
        attempt = 0
        try:
            while True:
                fetch = self.client.direct_fetch(self.handle, offset=self.received,
                                                 **self.fields)
                with self.lock:
                    if fetch is None or self.cancelled:
                        break
                    self.fetch = fetch
                try:
                    fetch.run(self._place, self._piece, self._message)
                    self.transport = "direct"
                    return
                except Unsupported as e:
                    if self.received:
                        raise LoadError(f"handle {self.handle}: the direct stream failed "
                                        f"after {self.received} bytes: {e}") from None
                    log.info("materializer: fetching %s through grpcio (%s)", self.handle, e)
                    break
                except RpcError as e:
                    if (e.code == grpc.StatusCode.UNAVAILABLE and attempt < self.client.retries
                            and not self.cancelled):
                        attempt += 1
                        time.sleep(min(0.1 * 2 ** attempt, 2.0))
                        continue
                    raise
            with self.lock:
                if self.cancelled:
                    return
                self.fallback = _StreamLoad(*self.args)
            self.transport = "grpcio"
            self.fallback.start()
            self.fallback.wait()
            self.received = self.fallback.received
        except BaseException as e:  # noqa: BLE001 - wait() raises it
            self.errors.append(e)
        finally:
            self.done.set()

    def _place(self, offset, n):
        if offset != self.received:
            raise LoadError(f"handle {self.handle}: chunk at {offset}, expected {self.received}")
        if offset + n > self.total:
            raise LoadError(f"handle {self.handle}: the stream goes past the {self.total} "
                            "bytes of the spec's layout; the handle does not hold this spec")
        return self.sink.views(offset, n)

    def _piece(self, views):
        n = 0
        for v in views:
            if self.verifier is not None:
                self.verifier.update(self.received + n, v)
            n += len(v)
        self.received += n
        if self.progress is not None:
            self.progress.update(n)

    def _message(self, offset, length, total_bytes, digest, tensor_digests):
        if total_bytes != self.total:
            raise LoadError(f"handle {self.handle}: the raw file is {total_bytes} bytes, the "
                            f"spec's layout {self.total}; the handle does not hold this spec")
        if digest:
            self.digest = digest
        if tensor_digests and self.verifier is not None:
            self.verifier.add(tensor_digests)
