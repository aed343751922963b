"""Zero-copy export (docs/delivery.md, "Export"): a second process maps a
CPU export and reads the same bytes without copying them; release is
refused while exported; after release and the importer's close the memory
is gone. CUDA IPC is tested where a GPU is present."""

import json
import os
import subprocess
import sys
import time

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
from materializer import digest, shm  # noqa: E402

import matutil  # noqa: E402
import serverproc  # noqa: E402

CLIENT = "export-test"
MIB = 1 << 20


def model(mib):
    return {"model": {"tensors": [
        {"name": "w", "shape": [mib, 256, 1024], "dtype": "float32"},
        {"name": "b", "shape": [33], "dtype": "bfloat16"},
        {"name": "tied", "shape": [33], "dtype": "bfloat16", "tieTo": "b"},
        {"name": "e", "shape": [0], "dtype": "int64"}],
        "initRules": [{"pattern": "e", "init": {"zeros": {}}},
                      {"pattern": "*", "init": {"normal": {"std": 2}}}],
        "seed": "3"}}


def materialize(server, mib, exportable=True):
    req = server.parse_request(json.dumps(model(mib)))
    req.exportable = exportable
    return server.materialize(req, client=CLIENT).handle


def export(server, handle, **kw):
    return server.stub.ExportHandle(
        server.pb.ExportRequest(handle=handle, **kw),
        metadata=server.md(CLIENT), timeout=60)


def close_export(server, export_id):
    return server.stub.CloseExport(
        server.pb.CloseExportRequest(export_id=export_id),
        metadata=server.md(CLIENT), timeout=60)


def shmem_bytes():
    return matutil.meminfo_bytes("Shmem")


def test_second_process_reads_the_export_without_copies(server, tmp_path):
    size_mib = 256
    before = shmem_bytes()
    h = materialize(server, size_mib)
    info = server.describe(h, client=CLIENT)
    exported = export(server, h)
    path = exported.shared_memory.path
    assert os.path.basename(path).startswith("materializer-")
    assert len(os.path.basename(path)) == len("materializer-") + 32
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert server.describe(h, client=CLIENT).exports == 1
    assert shmem_bytes() - before >= size_mib * MIB * 0.9

    pb_path = tmp_path / "export.pb"
    pb_path.write_bytes(exported.SerializeToString())
    importer = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "delivery_importer.py"),
         str(pb_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "MATERIALIZER_PY_PROTO": serverproc.PY_PROTO})
    try:
        first = json.loads(importer.stdout.readline())
        expected = {t.name: t.digest for t in info.tensors}
        assert first["digests"] == expected
        assert first["views"], "a tensor is not a view into the mapping"
        # Reading every byte mapped shared pages; nothing was copied into
        # the importer's private memory.
        grown_anon = first["after"]["RssAnon"] - first["before"]["RssAnon"]
        grown_shm = first["after"]["RssShmem"] - first["before"]["RssShmem"]
        assert grown_shm >= size_mib * MIB * 0.9, first
        assert grown_anon < 32 * MIB, first

        # Exported: a plain release is refused and changes nothing.
        with pytest.raises(grpc.RpcError) as e:
            server.release(h, client=CLIENT)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "CloseExport" in e.value.details()
        assert server.describe(h, client=CLIENT).exports == 1

        # The importer says it is done; then the release goes through and
        # the file's name is gone at once.
        assert close_export(server, exported.export_id).remaining_exports == 0
        released = server.release(h, client=CLIENT)
        assert released.released
        assert not os.path.exists(path)
        # The importer's mapping still holds the same bytes...
        importer.stdin.write("\n")
        importer.stdin.flush()
        assert json.loads(importer.stdout.readline())["digests"] == expected
        # ... and still holds the memory, until it closes.
        assert shmem_bytes() - before >= size_mib * MIB * 0.9
    finally:
        importer.stdin.close()
        importer.wait(timeout=60)
    assert importer.returncode == 0
    deadline = time.monotonic() + 10
    while shmem_bytes() - before > 32 * MIB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert shmem_bytes() - before <= 32 * MIB, "the shared memory outlived its last user"
    server.assert_idle(CLIENT)


def test_forced_release_while_exported(server):
    h = materialize(server, 4)
    exported = export(server, h)
    path = exported.shared_memory.path
    with shm.map_export(exported) as imported:
        w = imported.tensors["w"]
        before = digest.of_tensor(w)
        released = server.stub.Release(
            server.pb.ReleaseRequest(handle=h, force=True),
            metadata=server.md(CLIENT), timeout=60)
        assert released.released
        assert not os.path.exists(path)
        assert server.stats(CLIENT).in_use_bytes == 0  # the ledger let go
        assert digest.of_tensor(w) == before  # the mapping did not
    # The export can still be closed after the forced release; twice is
    # NOT_FOUND.
    assert close_export(server, exported.export_id).remaining_exports == 0
    with pytest.raises(grpc.RpcError) as e:
        close_export(server, exported.export_id)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_writable_import_is_private(server):
    h = materialize(server, 1)
    exported = export(server, h)
    with shm.map_export(exported, writable=True) as imported:
        original = digest.of_tensor(imported.tensors["w"])
        imported.tensors["w"].fill_(0)
    with shm.map_export(exported) as fresh:
        assert digest.of_tensor(fresh.tensors["w"]) == original
    close_export(server, exported.export_id)
    server.release(h, client=CLIENT)


def test_bad_exports(server):
    private = materialize(server, 1, exportable=False)
    try:
        with pytest.raises(grpc.RpcError) as e:
            export(server, private)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "exportable" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            export(server, private + "0")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            server.stub.ExportHandle(
                server.pb.ExportRequest(handle=private),
                metadata=server.md("someone-else"), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        for bad in ("x-nonsense", "", "x-" + "0" * 32 + "-" + private):
            with pytest.raises(grpc.RpcError) as e:
                close_export(server, bad)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND, bad
    finally:
        server.release(private, client=CLIENT)


def materialize_exported(server, mib, client=CLIENT, **fields):
    """Materialize with open_export: the MaterializeResponse."""
    req = server.parse_request(json.dumps(model(mib)))
    req.exportable = True
    req.open_export.SetInParent()
    for name, value in fields.items():
        setattr(req, name, value)
    return server.materialize(req, client=client)


def release(server, handle, client=CLIENT, **fields):
    return server.stub.Release(server.pb.ReleaseRequest(handle=handle, **fields),
                               metadata=server.md(client), timeout=60)


def test_materialize_opens_the_export_and_release_closes_it(server):
    resp = materialize_exported(server, 4)
    h, exported = resp.handle, resp.opened_export
    assert exported.export_id.endswith(h)
    assert os.path.exists(exported.shared_memory.path)
    info = server.describe(h, client=CLIENT)
    assert info.exports == 1  # a real export: counted, and it holds the handle
    assert {t.name: (t.offset, t.nbytes) for t in exported.tensors} == \
        {t.name: (t.arena_offset, t.nbytes) for t in info.tensors}
    with shm.map_export(exported) as imported:
        assert {n: digest.of_tensor(t) for n, t in imported.tensors.items()} == \
            {t.name: t.digest for t in info.tensors}
    # Exported, so a plain release is refused and changes nothing...
    with pytest.raises(grpc.RpcError) as e:
        release(server, h)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert server.describe(h, client=CLIENT).exports == 1
    # ... unless the release closes the export first: one call, no force.
    released = release(server, h, close_exports=[exported.export_id])
    assert released.released and released.exports_closed == 1
    assert not os.path.exists(exported.shared_memory.path)
    with pytest.raises(grpc.RpcError) as e:
        close_export(server, exported.export_id)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND  # closed by the release
    # Repeated (a retry after a lost answer): harmless, nothing to do.
    again = release(server, h, close_exports=[exported.export_id])
    assert not again.released and again.exports_closed == 0
    server.assert_idle(CLIENT)


def test_forced_release_closes_its_exports(server):
    resp = materialize_exported(server, 1)
    second = export(server, resp.handle)
    released = release(server, resp.handle, force=True,
                       close_exports=[resp.opened_export.export_id, second.export_id])
    assert released.released and released.exports_closed == 2
    # Nothing is left draining: both exports are gone with the handle.
    for export_id in (resp.opened_export.export_id, second.export_id):
        with pytest.raises(grpc.RpcError) as e:
            close_export(server, export_id)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    server.assert_idle(CLIENT)


def test_bad_open_export_and_close_exports(server):
    # Each refused before anything is reserved, naming the field.
    for fields, words in (({"async": True}, ("open_export", "async")),
                          ({"exportable": False}, ("open_export", "exportable"))):
        req = server.parse_request(json.dumps(model(1)))
        req.exportable = True
        req.open_export.SetInParent()
        for name, value in fields.items():
            setattr(req, name, value)
        with pytest.raises(grpc.RpcError) as e:
            server.materialize(req, client=CLIENT)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
        assert all(w in e.value.details() for w in words), e.value.details()
        server.assert_idle(CLIENT)
    req = server.parse_request(json.dumps(model(1)))
    req.exportable = True
    req.open_export.handle = "h-" + "0" * 32
    with pytest.raises(grpc.RpcError) as e:
        server.materialize(req, client=CLIENT)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "open_export.handle" in e.value.details()
    server.assert_idle(CLIENT)

    a = materialize_exported(server, 1)
    b = materialize_exported(server, 1)
    try:
        for ids, words in (([b.opened_export.export_id], ("close_exports[0]", "not an export")),
                           (["x-nonsense"], ("close_exports[0]",)),
                           ([a.opened_export.export_id] * 2, ("close_exports[1]", "the same id as close_exports[0]")),
                           ([a.opened_export.export_id] + ["x"] * 64, ("close_exports", "64"))):
            with pytest.raises(grpc.RpcError) as e:
                release(server, a.handle, force=True, close_exports=ids)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ids[:2]
            assert all(w in e.value.details() for w in words), e.value.details()
            # Nothing changed: both handles and both exports are still there.
            assert server.describe(a.handle, client=CLIENT).exports == 1
            assert server.describe(b.handle, client=CLIENT).exports == 1
        # Refused before the handle is looked up, so the same answer comes
        # to anyone; it must not repeat the handle's id (export ids carry it).
        for ids in (["x-" + a.handle] * 2, ["x-" + b.handle]):
            with pytest.raises(grpc.RpcError) as e:
                release(server, a.handle, client="someone-else", close_exports=ids)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert a.handle not in e.value.details() and b.handle not in e.value.details()
        # Another client cannot close this client's export through its own
        # Release: the handle is not theirs.
        with pytest.raises(grpc.RpcError) as e:
            release(server, a.handle, client="someone-else", force=True,
                    close_exports=[a.opened_export.export_id])
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert server.describe(a.handle, client=CLIENT).exports == 1
    finally:
        for r in (a, b):
            release(server, r.handle, close_exports=[r.opened_export.export_id])
    server.assert_idle(CLIENT)


def _cuda_devices():
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA for any reason
        return 0


def test_cuda_ipc_export_and_import(tmp_path):
    """requires-gpu: a CUDA handle exported over IPC and opened by a second
    process with torch; a mismatched device UUID is refused."""
    if _cuda_devices() == 0:
        print("SKIP reason: no CUDA device visible to torch on this machine")
        pytest.skip("requires-gpu: no CUDA device visible to torch")
    with serverproc.running_server(devices="cuda:0") as server:
        req = server.parse_request(json.dumps(model(64)))
        req.placement.device = "cuda:0"
        h = server.materialize(req, client=CLIENT).handle
        info = server.describe(h, client=CLIENT)
        with pytest.raises(grpc.RpcError) as e:
            export(server, h, importer_device_uuid="GPU-00000000-0000-0000-0000-000000000000")
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "importer's device" in e.value.details()
        exported = export(server, h)
        assert exported.cuda.device_uuid.startswith("GPU-")
        assert len(exported.cuda.ipc_handle) == 64
        pb_path = tmp_path / "export.pb"
        pb_path.write_bytes(exported.SerializeToString())
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "delivery_cuda_importer.py"),
             str(pb_path)], capture_output=True, text=True, timeout=300,
            env={**os.environ, "MATERIALIZER_PY_PROTO": serverproc.PY_PROTO})
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout.splitlines()[-1])
        assert got == {t.name: t.digest for t in info.tensors}
        close_export(server, exported.export_id)
        server.release(h, client=CLIENT)
