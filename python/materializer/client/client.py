"""Typed calls to materializerd: deadlines, retries of idempotent calls,
errors that carry the gRPC status and the server's message."""

import logging
import random
import threading
import time

import grpc

from materializer._proto import pb
from materializer.client import env, hints, wire
from materializer.client.channel import TLS, Connection
from materializer.client.direct import DirectFetch
from materializer.client.replicas import DISCOVERY_TIMEOUT_S, ReplicaSet
from materializer.client.session import Session
from materializer.errors import RpcError

from materializer.v1 import materializer_pb2_grpc as pb_grpc

log = logging.getLogger("materializer")
DEFAULT_ADDRESS = env.DEFAULT_SERVER
# A call that does not wait for a connection asks gRPC why there is none;
# it is given this long.
_PROBE_S = 1.0
_PROBE_MIN_S = 0.1
# Connection failures worth waiting out (within the connect timeout): no
# answer at all, or one not understood. The others (TLS on one side only,
# a certificate refused) are the same on every attempt.
_WAITED_REASONS = ("down", "")
_FETCH_METHOD = "/materializer.v1.Materializer/FetchWeights"
# Transient failures worth another try for a call that can be repeated.
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE,)
# Answers after which an id naming no replica is tried on the next one.
_TRY_NEXT_CODES = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
                   grpc.StatusCode.DEADLINE_EXCEEDED)


class Chunk:
    """One WeightChunk of a fetch, without copying its data: `data` is a
    memoryview into the received message. `tensor_digests`: its
    (name, digest) pairs (FETCH_DIGEST_TENSORS), in the order sent."""

    __slots__ = ("offset", "data", "total_bytes", "digest", "tensor_digests")

    def __init__(self, offset, data, total_bytes, digest, tensor_digests=()):
        self.offset = offset
        self.data = data
        self.total_bytes = total_bytes
        self.digest = digest
        self.tensor_digests = tensor_digests


def parse_chunk(raw):
    """A serialized WeightChunk -> Chunk, with `data` a view of `raw`.

    The generated parser would copy every chunk's payload into a new bytes
    object; the fetch path reads the fields itself instead (proto field
    numbers of WeightChunk: 1 offset, 2 data, 3 total_bytes, 4 digest,
    5 tensor_digests). Raises WireError (a ValueError) on bytes that are
    not a WeightChunk.
    """
    mv = memoryview(raw)
    offset = total = 0
    data = mv[0:0]
    digest = ""
    tensor_digests = []
    for field, kind, value in wire.fields(mv, "WeightChunk"):
        if kind == 0:
            if field == 1:
                offset = value
            elif field == 3:
                total = value
        elif kind == 2:
            if field == 2:
                data = value
            elif field == 4:
                digest = bytes(value).decode("ascii", "replace")
            elif field == 5:
                tensor_digests.append(wire.tensor_digest(value))
    return Chunk(offset, data, total, digest, tensor_digests)


class ReplicaResult:
    """One server's answer to a call made on every replica: `replica` (its
    name; "" for a single server or an unnamed replica), `address`, and
    either `result` (the response) or `error` (a materializer.RpcError)."""

    def __init__(self, replica, address, result=None, error=None):
        self.replica = replica
        self.address = address
        self.result = result
        self.error = error

    def __repr__(self):
        what = f"error={self.error}" if self.error is not None else "ok"
        return f"ReplicaResult({self.replica!r}, {self.address!r}, {what})"


class HandleList(list):
    """ListHandles over every replica: the HandleSummary of every replica
    that answered, oldest first; `failed` lists a ReplicaResult for each
    replica (or address) that did not answer."""

    def __init__(self, handles=(), failed=()):
        super().__init__(handles)
        self.failed = list(failed)


class Client:
    """A connection to materializerd with a session.

    address: "host:port" (default: $MATERIALIZER_SERVER, else
      127.0.0.1:50051); or several replicas: "host:port,host:port,..." or a
      name with several addresses (a headless Service). Each call then goes
      to the replica its handle id names, Materialize and Plan to the one
      with the most room (docs/api.md, "Several replicas").
    discovery_deadline: seconds for GetServerInfo at each replica's address.
    tls, token, client_name: identity (see Connection); tls=True is TLS
      trusting the system's roots. Left out, they come from matctl's
      variables (client/env.py): MATERIALIZER_TLS, MATERIALIZER_TLS_CA,
      MATERIALIZER_TLS_CERT, MATERIALIZER_TLS_KEY,
      MATERIALIZER_TLS_SERVER_NAME, MATERIALIZER_TOKEN or
      MATERIALIZER_TOKEN_FILE, MATERIALIZER_CLIENT; an identity given here
      is never mixed with one from there.
    connect_timeout: seconds a call waits for a connection to the server
      (default: $MATERIALIZER_CONNECT_TIMEOUT, else 3); then it fails with
      an RpcError that says why there is none and what to check (`hint`).
    deadline: seconds for each call (Materialize: materialize_deadline);
      a call that takes longer fails with DEADLINE_EXCEEDED.
    retries: how often an idempotent call (Plan, Describe, DescribeFile,
      GetStats, ListHandles, Renew, Release, a fetch resumed from its offset)
      is tried again after UNAVAILABLE, with exponential backoff.
      Materialize is never repeated (a repeat could create a second handle).
    session: open an Attach session on first use and bind every handle
      this client creates to it, so they are released when this process
      ends, however it ends (one session per replica materialized on).
    direct_fetch: streams into CPU memory receive FetchWeights on a
      connection of their own, straight into the destination tensors
      (client/direct.py), instead of through grpcio's messages; False:
      always grpcio.

    Usable from several threads. close() ends the session (the server
    releases its handles after the grace period) and the channels.
    """

    def __init__(self, address=None, *, tls=None, token=None, client_name=None,
                 connect_timeout=None, deadline=60.0, materialize_deadline=3600.0,
                 retries=4, session=True, options=(),
                 discovery_deadline=DISCOVERY_TIMEOUT_S, direct_fetch=True):
        self.address = address or env.server()
        self.connect_timeout = (env.connect_timeout() if connect_timeout is None
                                else float(connect_timeout))
        if not self.connect_timeout > 0:
            raise ValueError(f"connect_timeout must be above 0 seconds, not {connect_timeout}")
        self.deadline = deadline
        self.materialize_deadline = materialize_deadline
        self.retries = retries
        self.use_direct_fetch = direct_fetch
        self._use_session = session
        tls, token, token_source, client_name = _identity(tls, token, client_name)
        self._conn = Connection(tls=tls, token=token, client_name=client_name,
                                options=options, token_source=token_source)
        self._lock = threading.Lock()
        self._stubs = {}      # replica.key -> stub; guarded by _lock
        self._fetchers = {}   # (replica.key, lane) -> raw FetchWeights callable
        self._sessions = {}   # replica.key -> Session
        self._closed = False
        self._replicas = ReplicaSet(self.address, self._stub, self._conn.metadata,
                                    discovery_deadline)

    # -- routing -------------------------------------------------------------
    def _target(self, method, handle=None, placement=None, replica=None):
        """The servers to try, in turn, for a call: the one server; or, with
        several replicas, the replica `handle` (a handle or export id)
        names, else the one with the most room for `placement` (or the one
        named `replica`). The one place that chooses where a call goes."""
        if handle is not None:
            return self._replicas.for_id(handle, method)
        return [self._replicas.for_placement(placement or pb.Placement(), method, replica)]

    def has_replicas(self):
        """True when the address names several servers (decided from the
        address alone, without a call)."""
        return self._replicas.single() is None

    def _stub(self, replica):
        with self._lock:
            if self._closed:
                raise RuntimeError("materializer.Client is closed")
            stub = self._stubs.get(replica.key)
            if stub is None:
                stub = pb_grpc.MaterializerStub(
                    self._conn.channel(replica.address, tls_name=replica.tls_name))
                self._stubs[replica.key] = stub
            return stub

    def session(self, handle=None):
        """The session (opened on first use) on the server, or, with several
        replicas, on the replica holding `handle`; None when sessions are
        off."""
        if handle is None:
            replica = self._replicas.single()
            if replica is None:
                raise ValueError(f"{self.address} names several replicas, each with its own "
                                 "session: pass the handle whose session you want")
        else:
            replica = self._target("Attach", handle=handle)[0]
        return self._session_on(replica)

    def _session_on(self, replica):
        if not self._use_session:
            return None
        stub = self._stub(replica)
        with self._lock:
            s = self._sessions.get(replica.key)
        if s is None:
            try:
                opened = Session(stub, self._conn.metadata(), replica.address)
            except RpcError as e:
                raise self._replicas.explain(replica, e) from None
            with self._lock:
                s = self._sessions.setdefault(replica.key, opened)
            if s is not opened:
                opened.close()
        if s.lost:
            raise RpcError("Attach", grpc.StatusCode.UNAVAILABLE,
                           f"session {s.id} is gone: {s.lost}", replica.address)
        return s

    # -- one call ------------------------------------------------------------
    def _call(self, method, request, *, handle=None, placement=None, replica=None,
              idempotent=True, timeout=None, with_session=False):
        try:
            routes = self._target(method, handle=handle, placement=placement,
                                  replica=replica)
        except RpcError as e:
            raise self._hinted(e) from None
        # Several routes only for an id that names no replica: the first
        # replica that knows it answers.
        for i, route in enumerate(routes):
            try:
                return self._call_on(route, method, request, idempotent=idempotent,
                                     timeout=timeout, with_session=with_session)
            except RpcError as e:
                if i + 1 == len(routes) or e.code not in _TRY_NEXT_CODES:
                    raise self._hinted(e) from None

    def _call_on(self, replica, method, request, *, idempotent, timeout, with_session):
        timeout = self.deadline if timeout is None else timeout
        start = time.monotonic()
        deadline = start + timeout
        # One server: a call waits up to the connect timeout for it (to come
        # up, or back), then fails saying why there is no connection. Among
        # replicas, one that is down fails at once, so that its handles'
        # calls say so while the others keep serving.
        single = not self.has_replicas()
        if single:
            self._connect(replica, method, min(start + self.connect_timeout, deadline),
                          deadline)
        extra = ()
        if with_session:
            s = self._session_on(replica)
            if s is not None:
                extra = s.metadata()
        md = self._conn.metadata(extra)
        fn = getattr(self._stub(replica), method)
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            try:
                return _wait(fn.future(request, metadata=md, timeout=max(left, 0.001),
                                       wait_for_ready=False))
            except grpc.RpcError as e:
                code = e.code()
                if (idempotent and code in _RETRY_CODES and attempt < self.retries
                        and time.monotonic() < deadline):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0) * (0.5 + random.random()))
                    attempt += 1
                    if single:  # the server went away: wait for it as for the first
                        self._connect(replica, method,
                                      min(time.monotonic() + self.connect_timeout, deadline),
                                      deadline)
                    continue
                raise self._replicas.explain(
                    replica, RpcError(method, code, e.details() or "", replica.address)) from None

    def _connect(self, replica, method, connect_by, deadline):
        """Returns once the channel to `replica` is connected. Else raises
        the RpcError (with its reason and hint) of a call that does not wait
        for a connection, which says why there is none: at once when the
        server answered in a way no retry changes (TLS on one side only, a
        certificate refused), after waiting until `connect_by` when nobody
        answered (the server may be starting)."""
        channel = self._conn.channel(replica.address, tls_name=replica.tls_name)
        failure_seen = False
        while True:
            state = self._conn.wait_for_connection(channel, connect_by - time.monotonic(),
                                                   failure_seen)
            if state is grpc.ChannelConnectivity.READY:
                return
            failure_seen = state is not None
            error = self._why_not_connected(replica, method, deadline)
            if error is None:
                return  # connected after all
            waited_out = state is None or time.monotonic() >= connect_by
            if error.reason not in _WAITED_REASONS:
                raise error
            if waited_out:
                if connect_by >= deadline:  # the call's deadline ended the wait
                    error.code = grpc.StatusCode.DEADLINE_EXCEEDED
                    error.message = f"no connection before the call's deadline: {error.message}"
                raise error

    def _why_not_connected(self, replica, method, deadline):
        """The RpcError of one call that does not wait for a connection (it
        fails at once, with gRPC's reason for the last failed attempt), or
        None when the server answered it."""
        probe = self._stub(replica).GetServerInfo
        # Past the call's deadline too: gRPC's reason takes a moment.
        timeout = max(min(_PROBE_S, deadline - time.monotonic()), _PROBE_MIN_S)
        try:
            probe(pb.GetServerInfoRequest(), metadata=self._conn.metadata(), timeout=timeout,
                  wait_for_ready=False)
            return None
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None  # the server answered (refusing the probe): the call says more
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            code = grpc.StatusCode.UNAVAILABLE
            details = (f"no connection within the connect timeout, nor an answer within "
                       f"{timeout:g} s more ({details})")
        return self._hinted(RpcError(method, code, details, replica.address), connecting=True)

    def _hinted(self, error, connecting=False):
        """`error` with the reason and hint for its failure, when it is one
        matctl has a hint for (a connection that failed, credentials
        refused, a replica that does not answer)."""
        if error.reason:
            return error
        tls = self._conn.tls
        error.reason = hints.classify(
            error.code, error.message, tls=tls is not None,
            cert=tls is not None and tls.certificate_chain is not None,
            token=self._conn.token is not None, connecting=connecting)
        error.hint = hints.hint(
            error.reason, error.target or self.address, hints.API,
            ca=tls.root_certificates_file if tls is not None else "",
            cert=tls.certificate_chain_file if tls is not None else "",
            token_source=self._conn.token_source)
        return error

    def _on_every_replica(self, method, request, timeout):
        """[ReplicaResult]: `method` on the one server, or on every replica
        that answers discovery (in name order, in parallel), then an entry
        for each address that did not."""
        only = self._replicas.single()
        found = None
        if only is not None:
            routes = [only]
        else:
            found = self._replicas.reachable()
            routes = [d.replica for d in found if d.replica is not None]
        results = [ReplicaResult(r.name, r.address) for r in routes]

        def ask(entry, route):
            try:
                entry.result = self._call_on(route, method, request, idempotent=True,
                                             timeout=timeout, with_session=False)
            except RpcError as e:
                entry.error = e

        threads = [threading.Thread(target=ask, args=(entry, route), daemon=True)
                   for entry, route in zip(results, routes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for d in found or ():
            if d.replica is None:
                results.append(ReplicaResult("", d.address, error=d.error))
        return results

    # -- the API ---------------------------------------------------------------
    def inspect_checkpoint(self, path, digest=False, timeout=None):
        """CheckpointContents of `path` (ROOT/relative/path under the
        server's --checkpoint_roots): files, tensors and, for a folder,
        its config.json."""
        req = pb.InspectCheckpointRequest(path=path, digest=digest)
        return self._call("InspectCheckpoint", req, placement=pb.Placement(),
                          timeout=timeout)

    def plan(self, model, placement=None, timeout=None, replica=None, summary_only=False):
        """PlanResponse for a ModelSpec (bytes, where it fits now), from the
        replica Materialize would choose (or the one named `replica`).
        summary_only: without the per-tensor listing (`tensors`)."""
        req = pb.PlanRequest(model=model, placement=_placement(placement),
                             summary_only=summary_only)
        return self._call("Plan", req, placement=req.placement, replica=replica,
                          timeout=timeout)

    def materialize(self, model, placement=None, *, label="", exportable=False,
                    ttl=None, async_=False, timeout=None, replica=None, checkpoint=None,
                    open_export=False, importer_device_uuid=""):
        """MaterializeResponse; the handle is bound to this client's session
        (when sessions are on; on that replica), else leased for `ttl`
        seconds. With several replicas it lands on the one with the most
        room for `placement`, or on the one named `replica`. `checkpoint`: a
        CheckpointSource the server fills the tensors it holds from.
        open_export: the server also exports the handle (as export() would)
        and the response's `opened_export` holds it; a server older than
        that field leaves it unset (call export() then)."""
        req = pb.MaterializeRequest(model=model, placement=_placement(placement),
                                    label=label, exportable=exportable,
                                    **{"async": async_})
        if checkpoint is not None:
            req.checkpoint.CopyFrom(checkpoint)
        if open_export:
            req.open_export.SetInParent()
            req.open_export.importer_device_uuid = importer_device_uuid
        if ttl is not None:
            req.ttl.FromNanoseconds(int(ttl * 1e9))
        return self._call("Materialize", req, placement=req.placement, replica=replica,
                          idempotent=False,
                          timeout=self.materialize_deadline if timeout is None else timeout,
                          with_session=True)

    def describe(self, handle, timeout=None):
        return self._call("Describe", pb.DescribeRequest(handle=handle),
                          handle=handle, timeout=timeout)

    def describe_file(self, handle, timeout=None, **fetch_fields):
        return self._call("DescribeFile", pb.FetchRequest(handle=handle, **fetch_fields),
                          handle=handle, timeout=timeout)

    def release(self, handle, force=False, timeout=None, close_exports=()):
        """ReleaseResponse. close_exports: ids of this handle's exports the
        server closes first, in the same call."""
        return self._call("Release", pb.ReleaseRequest(handle=handle, force=force,
                                                       close_exports=list(close_exports)),
                          handle=handle, timeout=timeout)

    def renew(self, handle, timeout=None):
        return self._call("Renew", pb.RenewRequest(handle=handle), handle=handle,
                          timeout=timeout)

    def list_handles(self, timeout=None):
        """The caller's handles, oldest first. With several replicas: those
        of every replica that answered, merged, as a HandleList whose
        `failed` names the replicas that did not (RpcError only when none
        answered)."""
        if not self.has_replicas():
            return self._call("ListHandles", pb.ListHandlesRequest(), timeout=timeout).handles
        each = self._on_every_replica("ListHandles", pb.ListHandlesRequest(), timeout)
        answered = [e for e in each if e.error is None]
        failed = [e for e in each if e.error is not None]
        if not answered:
            raise self._hinted(failed[0].error)
        handles = [h for e in answered for h in e.result.handles]
        handles.sort(key=lambda h: (h.created_at.seconds, h.created_at.nanos, h.handle))
        for e in failed:
            log.warning("materializer: ListHandles: %s is missing from the list: %s",
                        e.replica or e.address, e.error)
        return HandleList(handles, failed)

    def stats(self, timeout=None, replica=None):
        """GetStatsResponse of the server; with several replicas, of the one
        named `replica` (stats_by_replica() asks them all)."""
        if replica is None and self.has_replicas():
            raise ValueError(f"{self.address} names several replicas: use "
                             "stats_by_replica(), or stats(replica=NAME)")
        return self._call("GetStats", pb.GetStatsRequest(), replica=replica, timeout=timeout)

    def server_info(self, timeout=None, replica=None):
        """ServerInfo of the server (its replica name, advertised address
        and devices with their free memory); with several replicas, of the
        one named `replica` (replicas() asks them all). Lighter than
        stats(): the server answers it without gathering its statistics."""
        if replica is None and self.has_replicas():
            raise ValueError(f"{self.address} names several replicas: use "
                             "replicas(), or server_info(replica=NAME)")
        return self._call("GetServerInfo", pb.GetServerInfoRequest(), replica=replica,
                          timeout=timeout)

    def stats_by_replica(self, timeout=None):
        """[ReplicaResult] of GetStats: one per replica, by name, then one
        per address that did not answer (one entry for a single server)."""
        return self._on_every_replica("GetStats", pb.GetStatsRequest(), timeout)

    def replicas(self):
        """[ReplicaResult] of GetServerInfo at every address of the target
        now (the replicas, their advertised addresses and free memory per
        device), replicas by name, then the addresses that did not answer."""
        return [ReplicaResult(d.replica.name if d.replica else "",
                              d.replica.address if d.replica else d.address,
                              result=d.info, error=d.error)
                for d in self._replicas.reachable()]

    def export(self, handle, importer_device_uuid="", timeout=None):
        # Not repeated: a repeat after a lost answer would leave an export
        # open that nobody closes.
        return self._call("ExportHandle",
                          pb.ExportRequest(handle=handle,
                                           importer_device_uuid=importer_device_uuid),
                          handle=handle, idempotent=False, timeout=timeout)

    def close_export(self, export_id, handle=None, timeout=None):
        """Closes an export. It goes where `export_id` says: an export id
        ends with its handle's id (`handle` is accepted and not needed)."""
        del handle
        return self._call("CloseExport", pb.CloseExportRequest(export_id=export_id),
                          handle=export_id, idempotent=False, timeout=timeout)

    def fetch(self, handle, *, offset=0, timeout=None, lane=0, **fields):
        """A FetchStream: iterate it for the chunks of a FetchWeights stream
        (Chunk objects whose `data` views the received message; copy it
        before the next one if you keep it); cancel() stops it from another
        thread. Resumes from the next offset after UNAVAILABLE, up to
        `retries` times. `timeout` bounds the whole stream (default: none).
        `lane`: streams on different lanes use different connections.
        With several replicas it streams from the replica `handle` names."""
        routes = [(r, self._fetcher(r, lane))
                  for r in self._target("FetchWeights", handle=handle)]
        return FetchStream(routes, handle, offset, fields, self._conn.metadata(), timeout,
                           self.retries, wait_for_ready=not self.has_replicas(),
                           explain=lambda r, e: self._hinted(self._replicas.explain(r, e)))

    def direct_fetch(self, handle, *, offset=0, **fields):
        """A DirectFetch (client/direct.py) of the same FetchWeights call,
        received straight into caller memory on a connection of its own; or
        None when this client does not use it (direct_fetch=False) or the
        handle's replica is not known from its id (several candidates)."""
        if not self.use_direct_fetch:
            return None
        routes = self._target("FetchWeights", handle=handle)
        if len(routes) != 1:
            return None
        replica = routes[0]
        request = pb.FetchRequest(handle=handle, offset=offset, **fields).SerializeToString()
        return DirectFetch(replica.address, request, self._conn.metadata(), tls=self._conn.tls,
                           tls_name=replica.tls_name, token=self._conn.token)

    def _fetcher(self, replica, lane):
        with self._lock:
            fetcher = self._fetchers.get((replica.key, lane))
        if fetcher is None:
            fetcher = self._conn.channel(replica.address, lane, replica.tls_name).unary_stream(
                _FETCH_METHOD,
                request_serializer=pb.FetchRequest.SerializeToString,
                response_deserializer=None)
            with self._lock:
                self._fetchers[(replica.key, lane)] = fetcher
        return fetcher

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


def _identity(tls, token, client_name):
    """(tls, token, where the token came from, client_name): the identity
    given, or, when none is, the one of the environment (env.py)."""
    if tls is True:
        tls = TLS()
    if tls is not None or token is not None or client_name is not None:
        return tls, token, "token=" if token is not None else "", client_name
    tls = env.tls()
    token, source = env.token()
    return tls, token, source, env.client_name() if tls is None else None


def _wait(future):
    """The result of a call, waited for in our own code: a Ctrl-C lands
    here (and cancels the call, so the server stops and rolls back) rather
    than inside gRPC's locks, where an interrupted thread could leave one
    held and hang the process on its way out."""
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    try:
        # Short waits: a Ctrl-C is handled between two of them even when
        # the kernel delivered the signal to another thread of the process.
        while not done.wait(0.25):
            pass
    except BaseException:
        future.cancel()
        raise
    return future.result()


class FetchStream:
    """The chunks of one FetchWeights stream (see Client.fetch). Iterate it
    in one thread; cancel() from any thread.

    `routes`: (replica, fetcher) pairs to try in turn (several only for an
    id that names no replica among several: the next is asked after a
    NOT_FOUND before the first chunk); `explain(replica, RpcError)` turns
    the final error into the one to raise."""

    def __init__(self, routes, handle, offset, fields, metadata, timeout, retries,
                 wait_for_ready=True, explain=None):
        self._routes = routes
        self._handle = handle
        self._offset = offset
        self._fields = fields
        self._md = metadata
        self._timeout = timeout
        self._retries = retries
        self._wait_for_ready = wait_for_ready
        self._explain = explain or (lambda replica, error: error)
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
        route = 0
        started = False
        next_offset = self._offset
        while True:
            replica, fetcher = self._routes[route]
            req = pb.FetchRequest(handle=self._handle, offset=next_offset, **self._fields)
            with self._lock:
                if self._cancelled:
                    raise RpcError("FetchWeights", grpc.StatusCode.CANCELLED,
                                   "cancelled by the client", replica.address)
                call = self._call = fetcher(req, metadata=self._md, timeout=self._timeout,
                                            wait_for_ready=self._wait_for_ready)
            try:
                for raw in call:
                    chunk = parse_chunk(raw)
                    next_offset = chunk.offset + len(chunk.data)
                    started = True
                    yield chunk
                return
            except grpc.RpcError as e:
                code = e.code()
                if (not started and code in _TRY_NEXT_CODES
                        and route + 1 < len(self._routes) and not self._cancelled):
                    route += 1
                    attempt = 0
                    continue
                if (code in _RETRY_CODES and attempt < self._retries
                        and not self._cancelled):
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    attempt += 1
                    continue
                raise self._explain(replica, RpcError("FetchWeights", code, e.details() or "",
                                                      replica.address)) from None
            finally:
                call.cancel()


def _placement(placement):
    if placement is None:
        return pb.Placement()
    if isinstance(placement, str):
        return pb.Placement(device=placement)
    return placement
