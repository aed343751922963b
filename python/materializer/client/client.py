"""Typed calls to materializerd: deadlines, retries of idempotent calls,
errors that carry the gRPC status and the server's message."""

import os
import random
import threading
import time

import grpc

from materializer._proto import pb
from materializer.client.channel import Connection
from materializer.client.session import Session
from materializer.errors import RpcError

from materializer.v1 import materializer_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
_FETCH_METHOD = "/materializer.v1.Materializer/FetchWeights"
# Transient failures worth another try for a call that can be repeated.
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE,)


class Chunk:
    """One WeightChunk of a fetch, without copying its data: `data` is a
    memoryview into the received message."""

    __slots__ = ("offset", "data", "total_bytes", "digest")

    def __init__(self, offset, data, total_bytes, digest):
        self.offset = offset
        self.data = data
        self.total_bytes = total_bytes
        self.digest = digest


def _varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def parse_chunk(raw):
    """A serialized WeightChunk -> Chunk, with `data` a view of `raw`.

    The generated parser would copy every chunk's payload into a new bytes
    object; the fetch path reads the four fields itself instead (proto
    field numbers of WeightChunk: 1 offset, 2 data, 3 total_bytes, 4 digest).
    """
    mv = memoryview(raw)
    pos, end = 0, len(raw)
    offset = total = 0
    data = mv[0:0]
    digest = ""
    while pos < end:
        key, pos = _varint(raw, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(raw, pos)
            if field == 1:
                offset = value
            elif field == 3:
                total = value
        elif wire == 2:
            n, pos = _varint(raw, pos)
            if field == 2:
                data = mv[pos:pos + n]
            elif field == 4:
                digest = bytes(mv[pos:pos + n]).decode("ascii")
            pos += n
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"WeightChunk: unexpected wire type {wire}")
    return Chunk(offset, data, total, digest)


class Client:
    """A connection to materializerd with a session.

    address: "host:port" (default: $MATERIALIZER_ADDRESS, else
      127.0.0.1:50051).
    tls, token, client_name: identity (see Connection).
    deadline: seconds for each call (Materialize: materialize_deadline);
      a call that takes longer fails with DEADLINE_EXCEEDED.
    retries: how often an idempotent call (Plan, Describe, DescribeFile,
      GetStats, ListHandles, Renew, Release, a fetch resumed from its offset)
      is tried again after UNAVAILABLE, with exponential backoff.
      Materialize is never repeated (a repeat could create a second handle).
    session: open an Attach session on first use and bind every handle
      this client creates to it, so they are released when this process
      ends, however it ends.

    Usable from several threads. close() ends the session (the server
    releases its handles after the grace period) and the channels.
    """

    def __init__(self, address=None, *, tls=None, token=None, client_name=None,
                 deadline=60.0, materialize_deadline=3600.0, retries=4,
                 session=True, options=()):
        self.address = address or os.environ.get("MATERIALIZER_ADDRESS",
                                                  DEFAULT_ADDRESS)
        self.deadline = deadline
        self.materialize_deadline = materialize_deadline
        self.retries = retries
        self._use_session = session
        self._conn = Connection(tls=tls, token=token, client_name=client_name,
                                options=options)
        self._lock = threading.Lock()
        self._stubs = {}      # target -> stub; guarded by _lock
        self._fetchers = {}   # (target, lane) -> raw FetchWeights callable
        self._sessions = {}   # target -> Session
        self._closed = False

    # -- routing -------------------------------------------------------------
    def _target(self, handle=None):
        """The server that answers a call about `handle` (or a new one).
        The one place that chooses a target: with replicas, a handle id
        names its replica and this maps it to an address."""
        return self.address

    def _stub(self, target):
        with self._lock:
            if self._closed:
                raise RuntimeError("materializer.Client is closed")
            stub = self._stubs.get(target)
            if stub is None:
                stub = pb_grpc.MaterializerStub(self._conn.channel(target))
                self._stubs[target] = stub
            return stub

    def session(self, target=None):
        """The session for `target` (opened on first use), or None when
        sessions are off."""
        if not self._use_session:
            return None
        target = target or self._target()
        stub = self._stub(target)
        with self._lock:
            s = self._sessions.get(target)
        if s is None:
            opened = Session(stub, self._conn.metadata(), target)
            with self._lock:
                s = self._sessions.setdefault(target, opened)
            if s is not opened:
                opened.close()
        if s.lost:
            raise RpcError("Attach", grpc.StatusCode.UNAVAILABLE,
                           f"session {s.id} is gone: {s.lost}", target)
        return s

    # -- one call ------------------------------------------------------------
    def _call(self, method, request, *, handle=None, idempotent=True,
              timeout=None, with_session=False):
        target = self._target(handle)
        extra = ()
        if with_session:
            s = self.session(target)
            if s is not None:
                extra = s.metadata()
        md = self._conn.metadata(extra)
        timeout = self.deadline if timeout is None else timeout
        deadline = time.monotonic() + timeout
        fn = getattr(self._stub(target), method)
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            try:
                return _wait(fn.future(request, metadata=md, timeout=max(left, 0.001),
                                       wait_for_ready=True))
            except grpc.RpcError as e:
                code = e.code()
                if (idempotent and code in _RETRY_CODES and attempt < self.retries
                        and time.monotonic() < deadline):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0) * (0.5 + random.random()))
                    attempt += 1
                    continue
                raise RpcError(method, code, e.details() or "", target) from None

    # -- the API ---------------------------------------------------------------
    def plan(self, model, placement=None, timeout=None):
        """PlanResponse for a ModelSpec (bytes, where it fits now)."""
        req = pb.PlanRequest(model=model, placement=_placement(placement))
        return self._call("Plan", req, timeout=timeout)

    def materialize(self, model, placement=None, *, label="", exportable=False,
                    ttl=None, async_=False, timeout=None):
        """MaterializeResponse; the handle is bound to this client's session
        (when sessions are on), else leased for `ttl` seconds."""
        req = pb.MaterializeRequest(model=model, placement=_placement(placement),
                                    label=label, exportable=exportable,
                                    **{"async": async_})
        if ttl is not None:
            req.ttl.FromNanoseconds(int(ttl * 1e9))
        return self._call("Materialize", req, idempotent=False,
                          timeout=self.materialize_deadline if timeout is None else timeout,
                          with_session=True)

    def describe(self, handle, timeout=None):
        return self._call("Describe", pb.DescribeRequest(handle=handle),
                          handle=handle, timeout=timeout)

    def describe_file(self, handle, timeout=None, **fetch_fields):
        return self._call("DescribeFile", pb.FetchRequest(handle=handle, **fetch_fields),
                          handle=handle, timeout=timeout)

    def release(self, handle, force=False, timeout=None):
        return self._call("Release", pb.ReleaseRequest(handle=handle, force=force),
                          handle=handle, timeout=timeout)

    def renew(self, handle, timeout=None):
        return self._call("Renew", pb.RenewRequest(handle=handle), handle=handle,
                          timeout=timeout)

    def list_handles(self, timeout=None):
        return self._call("ListHandles", pb.ListHandlesRequest(), timeout=timeout).handles

    def stats(self, timeout=None):
        return self._call("GetStats", pb.GetStatsRequest(), timeout=timeout)

    def export(self, handle, importer_device_uuid="", timeout=None):
        # Not repeated: a repeat after a lost answer would leave an export
        # open that nobody closes.
        return self._call("ExportHandle",
                          pb.ExportRequest(handle=handle,
                                           importer_device_uuid=importer_device_uuid),
                          handle=handle, idempotent=False, timeout=timeout)

    def close_export(self, export_id, handle=None, timeout=None):
        return self._call("CloseExport", pb.CloseExportRequest(export_id=export_id),
                          handle=handle, idempotent=False, timeout=timeout)

    def fetch(self, handle, *, offset=0, timeout=None, lane=0, **fields):
        """A FetchStream: iterate it for the chunks of a FetchWeights stream
        (Chunk objects whose `data` views the received message; copy it
        before the next one if you keep it); cancel() stops it from another
        thread. Resumes from the next offset after UNAVAILABLE, up to
        `retries` times. `timeout` bounds the whole stream (default: none).
        `lane`: streams on different lanes use different connections."""
        target = self._target(handle)
        with self._lock:
            fetcher = self._fetchers.get((target, lane))
        if fetcher is None:
            fetcher = self._conn.channel(target, lane).unary_stream(
                _FETCH_METHOD,
                request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=None)
            with self._lock:
                self._fetchers[(target, lane)] = fetcher
        return FetchStream(fetcher, handle, offset, fields, self._conn.metadata(), timeout,
                           self.retries, target)

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.close()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _wait(future):
    """The result of a call, waited for in our own code: a Ctrl-C lands
    here (and cancels the call, so the server stops and rolls back) rather
    than inside gRPC's locks, where an interrupted thread could leave one
    held and hang the process on its way out."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    try:
        done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()


class FetchStream:
    """The chunks of one FetchWeights stream (see Client.fetch). Iterate it
    in one thread; cancel() from any thread."""

    def __init__(self, fetcher, handle, offset, fields, metadata, timeout, retries, target):
        self._fetcher = fetcher
        self._handle = handle
        self._offset = offset
        self._fields = fields
        self._md = metadata
        self._timeout = timeout
        self._retries = retries
        self._target = target
        self._lock = threading.Lock()
        self._call = None       # guarded by _lock
        self._cancelled = False  # guarded by _lock

    def cancel(self):
        with self._lock:
            self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()

    def __iter__(self):
        attempt = 0
        next_offset = self._offset
        while True:
            req = pb.FetchRequest(handle=self._handle, offset=next_offset, **self._fields)
            with self._lock:
                if self._cancelled:
                    raise RpcError("FetchWeights", grpc.StatusCode.CANCELLED,
                                   "cancelled by the client", self._target)
                call = self._call = self._fetcher(req, metadata=self._md, timeout=self._timeout,
                                                  wait_for_ready=True)
            try:
                for raw in call:
                    chunk = parse_chunk(raw)
                    next_offset = chunk.offset + len(chunk.data)
                    yield chunk
                return
            except grpc.RpcError as e:
                if (e.code() in _RETRY_CODES and attempt < self._retries
                        and not self._cancelled):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    attempt += 1
                    continue
                raise RpcError("FetchWeights", e.code(), e.details() or "",
                               self._target) from None
            finally:
                call.cancel()


def _placement(placement):
    if placement is None:
        return pb.Placement()
    if isinstance(placement, str):
        return pb.Placement(device=placement)
    return placement
