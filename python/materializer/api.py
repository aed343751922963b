"""The one call: a meta module -> initialized weights in this process.

Composes the three layers: capture (describe), client (Plan and
Materialize on the server), load (the handle's bytes into the module),
then releases the handle.
"""

import ipaddress
import logging
import sys
import time

import torch

from materializer import capture
from materializer.client import Client
from materializer.errors import LoadError, RpcError
from materializer.load import (Targets, check_loaded, copy_cuda_ipc, device_uuid,
                               load_stream, shm_views)

log = logging.getLogger("materializer")
TRANSPORTS = ("auto", "stream", "shm", "ipc")
# Progress bars for models at least this large (and only on a terminal).
PROGRESS_BYTES = 256 << 20
# Parallel fetch streams of the stream transport (bench/sdk.py measures it).
STREAMS = 1


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
    unless keep_handle); `transport`: "stream", "shm" or "ipc"; `bytes`:
    tensor bytes delivered; `seconds`: per phase (describe, materialize,
    load, total); `spec`; `client` (keep it open while you keep a handle:
    the handle lives in its session)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return (f"Materialized(handle={self.handle!r}, transport={self.transport!r}, "
                f"bytes={self.bytes:,}, seconds={ {k: round(v, 3) for k, v in self.seconds.items()} })")


def co_located(address):
    """Whether `address` is this host (loopback or a Unix socket)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.rsplit(":", 1)[0] if not address.startswith("[") else address[1:].split("]")[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_cuda_device(client, device):
    """The pool device holding the same GPU as `device`, or None."""
    try:
        uuid = device_uuid(device)
    except Exception:  # noqa: BLE001 - no CUDA properties: no IPC
        return None
    for d in client.stats().devices:
        if d.device.startswith("cuda") and d.HasField("driver") and d.driver.uuid == uuid:
            return d.device
    return None


def _progress(enabled, total, desc):
    if enabled is False or (enabled is None and (total < PROGRESS_BYTES or not sys.stderr.isatty())):
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                disable=False)


def materialize(model, server=None, *, client=None, device="cpu", seed=0,
                rng="portable", spec=None, transport="auto", placement=None,
                keep_handle=False, progress=None, verify=True, streams=STREAMS,
                label="", **describe_kwargs):
    """Initializes every meta tensor of `model` in place, through the
    server, and returns a Materialized.

    server: address ("host:port"); or client: a materializer.Client.
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
    verify: check the streamed bytes against the server's digest.
    streams: parallel fetch streams (each on its own connection) for the
      stream transport.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    t0 = time.perf_counter()
    if spec is None:
        spec = describe(model, seed=seed, rng=rng, **describe_kwargs)
    t_describe = time.perf_counter()
    targets = Targets(model, spec)
    device = torch.device(device)
    own_client = client is None
    if own_client:
        client = Client(server)
    try:
        mode, where = _choose(client, transport, device, placement)
        resp = client.materialize(spec.to_proto(), where, label=label,
                                  exportable=(mode == "shm"))
        t_mat = time.perf_counter()
        try:
            mode = _load(client, resp.handle, spec, targets, device, mode, transport,
                         progress, verify, streams)
        except BaseException:
            _release(client, resp.handle, force=True)
            raise
        t_load = time.perf_counter()
        if not keep_handle:
            _release(client, resp.handle, force=(mode == "shm"))
        missing = check_loaded(model)
        if missing:
            raise LoadError("still on the meta device after loading: " + ", ".join(missing[:10]))
        return Materialized(handle=resp.handle, transport=mode, bytes=spec.nbytes,
                            spec=spec, client=None if (own_client and not keep_handle) else client,
                            device=resp.device,
                            seconds={"describe": t_describe - t0,
                                     "materialize": t_mat - t_describe,
                                     "load": t_load - t_mat,
                                     "total": time.perf_counter() - t0})
    finally:
        if own_client and not keep_handle:
            client.close()


def _choose(client, transport, device, placement):
    """(transport, placement) for this call."""
    local = co_located(client.address)
    if transport == "auto":
        if local and device.type in ("cpu", "cuda"):
            pool = [d.device for d in client.stats().devices]
            if device.type == "cpu" and (placement or "cpu") in pool:
                return "shm", placement or "cpu"
            if device.type == "cuda":
                where = placement or _server_cuda_device(client, device)
                if where is not None:
                    return "ipc", where
        return "stream", placement
    if transport == "shm":
        return "shm", placement or "cpu"
    if transport == "ipc":
        if device.type != "cuda":
            raise ValueError("transport='ipc' needs a CUDA device of this process")
        return "ipc", placement or _server_cuda_device(client, device)
    return "stream", placement


def _load(client, handle, spec, targets, device, mode, requested, progress, verify, streams):
    if mode in ("shm", "ipc"):
        export = None
        try:
            uuid = device_uuid(device) if mode == "ipc" else ""
            export = client.export(handle, importer_device_uuid=uuid)
            if mode == "shm":
                views = shm_views(export, spec)
                if device.type != "cpu":
                    views = {k: v.to(device) for k, v in views.items()}
                targets.adopt(views)
            else:
                dests = targets.allocate(device)
                copy_cuda_ipc(export, spec, dests, device)
            return mode
        except (RpcError, OSError, LoadError) as e:
            if requested != "auto":
                raise
            log.info("materializer: zero-copy delivery failed (%s); streaming", e)
        finally:
            if export is not None:
                try:
                    client.close_export(export.export_id, handle=handle)
                except RpcError as e:
                    log.warning("materializer: CloseExport %s: %s", export.export_id, e)
    # The tensors go into the module only once every byte arrived: a failed
    # load leaves it on the meta device (FSDP2 allocates its own, in place).
    dests = targets.allocate(device) if targets.managed else targets.new_tensors(device)
    bar = _progress(progress, spec.nbytes, "materializer")
    try:
        load_stream(client, handle, spec, dests, device=device, progress=bar, verify=verify,
                    streams=streams)
    finally:
        if bar is not None:
            bar.close()
    if not targets.managed:
        targets.install(dests)
    return "stream"


def _release(client, handle, force):
    try:
        client.release(handle, force=force)
    except RpcError as e:
        log.warning("materializer: Release %s: %s", handle, e)
