"""The one call: a meta module -> initialized weights in this process.

Composes the three layers: capture (describe), client (Plan and
Materialize on the server), load (the handle's bytes into the module),
then releases the handle.
"""

import functools
import ipaddress
import logging
import sys
import threading
import time

import torch

from materializer import capture, hf
from materializer.checkpoint import (CheckpointReport, as_checkpoint, check_assembled,
                                     for_tensors)
from materializer.client import Client
from materializer.errors import LoadError, RpcError, in_call
from materializer.load import (Targets, check_loaded, copy_cuda_ipc, device_uuid,
                               load_stream, shm_views)
from materializer.load.resident import MakeResident

log = logging.getLogger("materializer")
TRANSPORTS = ("auto", "stream", "shm", "ipc")
# Progress bars for models at least this large (and only on a terminal).
PROGRESS_BYTES = 256 << 20
# Parallel fetch streams of the stream transport (bench/sdk.py measures it).
STREAMS = 1
# The stream transport materializes a larger model in parts of about this
# many bytes, the next part while the last one streams (docs/python.md,
# "Parts"); bench/sdk.py measures it.
PART_BYTES = 512 << 20
# ListHandles' label limit (MaterializeRequest.label).
LABEL_BYTES = 256


def describe(model, **kwargs):
    """capture.describe(model, ...) with the model's own init hook, which
    for a Hugging Face model is its init protocol (materializer.hf)."""
    if kwargs.get("init") is None:
        from materializer import hf
        if hf.is_hf_model(model):
            kwargs["init"] = hf.init_hook(model)
    return capture.describe(model, **kwargs)


class Materialized:
    """What materialize() did. `handle`: the server's handle (released
    unless keep_handle; None when the model came in several parts);
    `parts`: how many handles the model was materialized in (one per part,
    each released once loaded); `transport`: "stream", "shm" or "ipc";
    `bytes`: tensor bytes delivered; `seconds`: per phase (describe,
    materialize: until the first part was ready, load: the rest, total);
    `spec`; `client` (keep it open while you keep a handle: the handle
    lives in its session); `checkpoint`: a CheckpointReport when a
    checkpoint was named, else None."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return (f"Materialized(handle={self.handle!r}, transport={self.transport!r}, "
                f"bytes={self.bytes:,}, seconds={ {k: round(v, 3) for k, v in self.seconds.items()} })")


def co_located(address):
    """Whether `address` is this host (loopback or a Unix socket); for a
    list of replicas, whether every one is."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    if "," in address:
        return all(co_located(a.strip()) for a in address.split(","))
    host = address.rsplit(":", 1)[0] if not address.startswith("[") else address[1:].split("]")[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_cuda_device(client, device):
    """(replica, pool device) holding the same GPU as `device`, or (None,
    None). The replica is None for a single server."""
    try:
        uuid = device_uuid(device)
    except Exception:  # noqa: BLE001 - no CUDA properties: no IPC
        return None, None
    if client.has_replicas():
        pools = [(r.replica, r.result.devices) for r in client.stats_by_replica()
                 if r.error is None]
    else:
        pools = [(None, client.stats().devices)]
    for replica, devices in pools:
        for d in devices:
            if d.device.startswith("cuda") and d.HasField("driver") and d.driver.uuid == uuid:
                return replica, d.device
    return None, None


def _server_devices(client):
    """The devices of the server's pool, or of every replica's."""
    if client.has_replicas():
        return {d.device for r in client.replicas() if r.error is None for d in r.result.devices}
    return {d.device for d in client.server_info().devices}


def _progress(enabled, total, desc):
    if enabled is False or (enabled is None and (total < PROGRESS_BYTES or not sys.stderr.isatty())):
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=False)


def _user_call(name):
    """Decorator: an RpcError raised in the function names it as the call
    it failed in (RpcError.call), rather than only the RPC."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except RpcError as e:
                in_call(e, name)
                raise
        return call
    return wrap


def _client_for(server, client, tls, token, connect_timeout, session=True):
    """(the client to use, whether it is ours to close)."""
    if client is None:
        return Client(server, tls=tls, token=token, connect_timeout=connect_timeout,
                      session=session), True
    given = [name for name, value in (("server", server), ("tls", tls), ("token", token),
                                      ("connect_timeout", connect_timeout))
             if value is not None]
    if given:
        raise ValueError(f"pass either client= or {', '.join(n + '=' for n in given)} "
                         "(the client has its own)")
    return client, False


@_user_call("plan")
def plan(model, server=None, *, client=None, tls=None, token=None, connect_timeout=None,
         seed=0, rng="portable", spec=None, placement=None, replica=None,
         summary_only=False, **describe_kwargs):
    """The server's Plan for `model` (a PlanResponse): the arena's bytes
    and which of its devices it fits on now. Nothing is allocated.
    summary_only: leave out the per-tensor listing (`tensors`), most of
    the response for a model of many tensors.

    server, tls, token, connect_timeout: as for Client (left out: the
    MATERIALIZER_* variables); or client: a materializer.Client.
    spec: an already described Spec (else describe(model, seed, rng, ...)).
    placement: a device ("cuda:0"), a kind ("cuda") or "auto" (default).
    """
    if spec is None:
        spec = describe(model, seed=seed, rng=rng, **describe_kwargs)
    client, own_client = _client_for(server, client, tls, token, connect_timeout,
                                      session=False)
    try:
        return client.plan(spec.to_proto(), placement=placement, replica=replica,
                           summary_only=summary_only)
    finally:
        if own_client:
            client.close()


@_user_call("materialize")
def materialize(model, server=None, *, client=None, tls=None, token=None,
                connect_timeout=None, device="cpu", seed=0,
                rng="portable", spec=None, transport="auto", placement=None,
                keep_handle=False, progress=None, verify=True, streams=STREAMS,
                part_bytes=PART_BYTES, label="", checkpoint=None, **describe_kwargs):
    """Initializes every meta tensor of `model` in place, through the
    server, and returns a Materialized.

    server: address ("host:port", or replicas); tls (a materializer.TLS, or
      True for the system's roots), token (a bearer token, over TLS),
      connect_timeout (seconds to wait for a connection): as for Client,
      which reads the MATERIALIZER_* variables for what is left out. Or
      client: a materializer.Client.
    device: where the weights go ("cpu", "cuda:0", ...).
    seed, rng ("portable" or "torch"), and the other keywords: describe().
      Or spec: an already described Spec.
    transport: "auto" (shared memory or CUDA IPC when the server is on this
      host, else the stream), or force "stream", "shm", "ipc".
    placement: the server device for the handle (default: chosen by the
      transport, else the server's "auto").
    keep_handle: do not release the handle (it stays in the client's
      session; pass your own client and keep it open).
    progress: a tqdm bar (None: on a terminal for models >= 256 MiB).
    verify: check each streamed tensor's bytes against the server's digest
      of that tensor.
    streams: parallel fetch streams (each on its own connection) for the
      stream transport.
    part_bytes: the stream transport (without keep_handle) materializes a
      model larger than this in parts of about this many bytes, one handle
      each, the next part on the server while the last one streams: the
      server holds at most two parts at once, and its init overlaps the
      transfer. The bytes are those of the whole model materialized at
      once. 0: one handle for the whole model.
    checkpoint: "ROOT/relative/path" (or a materializer.Checkpoint) of a
      checkpoint the server reads: each tensor it holds comes from it, the
      others from the model's init; the result's `checkpoint` says what
      was loaded, initialized and left unused (docs/checkpoints.md).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    if part_bytes < 0:
        raise ValueError(f"part_bytes must be >= 0 (0: one handle), not {part_bytes}")
    source = as_checkpoint(checkpoint)
    source_pb = source.to_proto() if source is not None else None
    reports = []
    t0 = time.perf_counter()
    device = torch.device(device)
    client, own_client = _client_for(server, client, tls, token, connect_timeout)
    try:
        # Choosing the transport may ask the server for its devices: asked
        # while describe() records the model, the round trip is off the
        # call's path (on a busy host it took up to 0.1 s).
        choice = _Ahead(_choose, client, transport, device, placement)
        if source is not None and hf.is_hf_model(model):
            # save_pretrained writes the names transformers' conversions
            # read (and layouts they convert): follow the renamings, refuse
            # the conversions, before anything is held.
            source = hf.adapt_checkpoint(model, source, client)
            source_pb = source.to_proto()
        if spec is None:
            spec = describe(model, seed=seed, rng=rng, **describe_kwargs)
        t_describe = time.perf_counter()
        targets = Targets(model, spec)
        mode, where, replica = choice.result()
        # Streamed CPU weights land in new tensors whose pages are mapped on
        # first write; allocating them now and making them resident while
        # the server materializes takes those faults off the transfer
        # (load/resident.py says what it costs).
        early = resident = None
        if mode == "stream" and device.type == "cpu" and not targets.managed:
            early = targets.new_tensors(device)
            resident = MakeResident(list(early.values())).start()
        parts = [spec]
        if mode == "stream" and part_bytes and not keep_handle:
            parts = spec.split(part_bytes)
        to_close = ()
        try:
            if len(parts) > 1:
                handle = None
                server_device, t_mat = _stream_parts(client, parts, where, targets, device,
                                                     label, progress, verify, streams,
                                                     dests=early, checkpoint=source_pb,
                                                     reports=reports)
            else:
                # Shared memory: the export comes with the handle, one round
                # trip (and one wait behind this client's other calls) less.
                resp = client.materialize(spec.to_proto(), where, label=label,
                                          exportable=(mode == "shm"), replica=replica,
                                          checkpoint=source_pb, open_export=(mode == "shm"))
                handle, server_device = resp.handle, resp.device
                reports.append(resp.checkpoint)
                t_mat = time.perf_counter()
                try:
                    check_assembled(source_pb, resp.checkpoint)
                    mode, to_close = _load(
                        client, handle, spec, targets, device, mode, transport, progress,
                        verify, streams, dests=early, keep_handle=keep_handle,
                        export=resp.opened_export if resp.HasField("opened_export") else None)
                except BaseException:
                    _release(client, handle, force=True)
                    raise
        finally:
            if resident is not None:
                resident.stop()
        t_load = time.perf_counter()
        if handle is not None and not keep_handle:
            _release(client, handle, force=(mode == "shm"), close_exports=to_close)
        missing = check_loaded(model)
        if missing:
            raise LoadError("still on the meta device after loading: " + ", ".join(missing[:10]))
        return Materialized(handle=handle, parts=len(parts), transport=mode,
                            bytes=spec.nbytes, spec=spec,
                            client=None if (own_client and not keep_handle) else client,
                            device=server_device,
                            checkpoint=CheckpointReport(reports) if source else None,
                            seconds={"describe": t_describe - t0,
                                     "materialize": t_mat - t_describe,
                                     "load": t_load - t_mat,
                                     "total": time.perf_counter() - t0})
    finally:
        if own_client and not keep_handle:
            client.close()


class _Ahead:
    """fn(*args) on a thread of its own, started now; result() waits for
    it and returns its value or raises its exception. Left unasked (the
    caller failed first), the thread ends with its call and is dropped."""

    def __init__(self, fn, *args):
        self._outcome = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True,
                                        name="materializer-ahead")
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._outcome = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - raised in result()
            self._outcome = (False, e)

    def result(self):
        self._thread.join()
        ok, value = self._outcome
        if not ok:
            raise value
        return value


def _choose(client, transport, device, placement):
    """(transport, placement, replica) for this call; replica: the name of
    the replica the handle must land on (the one sharing this process's
    GPU, for CUDA IPC among replicas), else None (the client chooses)."""
    local = co_located(client.address)
    if transport == "auto":
        if local and device.type in ("cpu", "cuda"):
            if device.type == "cpu" and (placement or "cpu") in _server_devices(client):
                return "shm", placement or "cpu", None
            if device.type == "cuda":
                replica, where = ((None, placement) if placement
                                  else _server_cuda_device(client, device))
                if where is not None:
                    return "ipc", where, replica
        return "stream", placement, None
    if transport == "shm":
        return "shm", placement or "cpu", None
    if transport == "ipc":
        if device.type != "cuda":
            raise ValueError("transport='ipc' needs a CUDA device of this process")
        replica, where = (None, placement) if placement else _server_cuda_device(client, device)
        return "ipc", where, replica
    return "stream", placement, None


def _load(client, handle, spec, targets, device, mode, requested, progress, verify, streams,
          dests=None, keep_handle=True, export=None):
    """Delivers the handle into the module; returns the transport used and
    the ids of exports the caller closes with its release of the handle.
    dests: destination tensors the stream transport fills (from
    targets.new_tensors; default: allocated here). keep_handle: the handle
    outlives the call, so shared memory is mapped copy-on-write (else the
    pages themselves, which become the trainer's once the handle is
    released, before materialize() returns). export: the handle's export,
    when Materialize opened it (else exported here)."""
    if mode in ("shm", "ipc"):
        # An export that came with the handle is closed by the release that
        # follows (one call); one opened here, or a kept handle's, now.
        close_with_release = export is not None and not keep_handle
        handed_over = False
        try:
            uuid = device_uuid(device) if mode == "ipc" else ""
            if export is None:
                export = client.export(handle, importer_device_uuid=uuid)
            if mode == "shm":
                views = shm_views(export, spec, shared=not keep_handle)
                if device.type != "cpu":
                    views = {k: v.to(device) for k, v in views.items()}
                targets.adopt(views)
            else:
                dests = targets.allocate(device)
                copy_cuda_ipc(export, spec, dests, device)
            handed_over = close_with_release
            return mode, ([export.export_id] if handed_over else ())
        except (RpcError, OSError, LoadError) as e:
            if requested != "auto":
                raise
            log.info("materializer: zero-copy delivery failed (%s); streaming", e)
        finally:
            # Closed even though a forced release follows: the server keeps
            # a force-released handle's exports closable, so one never
            # closed would stay registered for the server's life.
            if export is not None and not handed_over:
                try:
                    client.close_export(export.export_id, handle=handle)
                except RpcError as e:
                    log.warning("materializer: CloseExport %s: %s", export.export_id, e)
    # The tensors go into the module only once every byte arrived: a failed
    # load leaves it on the meta device (FSDP2 allocates its own, in place).
    if dests is None:
        dests = _destinations(targets, device)
    bar = _progress(progress, spec.nbytes, "materializer")
    try:
        load_stream(client, handle, spec, dests, device=device, progress=bar, verify=verify,
                    streams=streams)
    finally:
        if bar is not None:
            bar.close()
    if not targets.managed:
        targets.install(dests)
    return "stream", ()


def _stream_parts(client, parts, where, targets, device, label, progress, verify, streams,
                  dests=None, checkpoint=None, reports=None):
    """The stream transport for a model in parts (Spec.split): while part k
    streams into the destinations, part k + 1 is materialized on a thread,
    and each part's handle is released as soon as its bytes are in. So the
    server holds at most two parts, and its init overlaps the transfer
    instead of preceding it. Returns (the server device of the first part,
    the time it was ready). On any failure (a Ctrl-C included) every part
    still held is released before the error propagates; the module's
    tensors are installed only after the last part, as with one handle
    (managed targets, FSDP2's own, are written in place)."""
    if dests is None:
        dests = _destinations(targets, device)
    bar = _progress(progress, sum(p.nbytes for p in parts), "materializer")
    following = _MaterializePart(client, parts[0], where, _part_label(label, 0, len(parts)),
                                 checkpoint)
    current = server_device = first_ready = None
    try:
        for k, part in enumerate(parts):
            sent = following.checkpoint
            resp = following.result()
            following, current = None, resp.handle
            check_assembled(sent, resp.checkpoint)
            if reports is not None:
                reports.append(resp.checkpoint)
            if first_ready is None:
                server_device, first_ready = resp.device, time.perf_counter()
            if k + 1 < len(parts):
                following = _MaterializePart(client, parts[k + 1], where,
                                             _part_label(label, k + 1, len(parts)),
                                             checkpoint)
            load_stream(client, current, part, dests, device=device, progress=bar,
                        verify=verify, streams=streams)
            done, current = current, None
            _release(client, done, force=False)
    except BaseException:
        if current is not None:
            _release(client, current, force=True)
        if following is not None:
            following.release()
        raise
    finally:
        if bar is not None:
            bar.close()
    if not targets.managed:
        targets.install(dests)
    return server_device, first_ready


def _destinations(targets, device):
    """New tensors the stream fills (FSDP2's own, for managed targets)."""
    return targets.allocate(device) if targets.managed else targets.new_tensors(device)


def _part_label(label, index, count):
    """The label of part `index` (ListHandles shows it), unless the suffix
    would not fit."""
    labelled = f"{label} [part {index + 1}/{count}]"
    return labelled.lstrip() if len(labelled.encode()) <= LABEL_BYTES else label


class _MaterializePart:
    """Materialize of one part on a daemon thread, so that a Ctrl-C lands
    in the caller waiting for it, never inside gRPC."""

    def __init__(self, client, part, where, label, checkpoint=None):
        self._client = client
        self._model, self._where, self._label = part.to_proto(), where, label
        self._checkpoint = (for_tensors(checkpoint, (t.name for t in self._model.tensors))
                            if checkpoint is not None else None)
        self._resp = self._error = None
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="materializer-part").start()

    @property
    def checkpoint(self):
        """The CheckpointSource this part sends (its own assemblies only)."""
        return self._checkpoint

    def _run(self):
        try:
            self._resp = self._client.materialize(self._model, self._where, label=self._label,
                                                  checkpoint=self._checkpoint)
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error = e
        finally:
            self._done.set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._resp

    def release(self):
        """Waits for the call and releases what it made (a failed call made
        nothing)."""
        try:
            resp = self.result()
        except BaseException:  # noqa: BLE001 - nothing was made
            return
        _release(self._client, resp.handle, force=True)


def _release(client, handle, force, close_exports=()):
    try:
        client.release(handle, force=force, close_exports=close_exports)
    except RpcError as e:
        log.warning("materializer: Release %s: %s", handle, e)
