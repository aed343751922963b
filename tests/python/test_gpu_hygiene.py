"""GPU hygiene: GetStats reports each GPU as its driver sees it (total,
used, free, this server's bytes, and every other process with its state),
and admission refuses what the driver says is not free, before any
allocation.

On any machine through a fake driver file standing behind the virtual
device cpu:1 (--fake_gpu_driver; the server re-reads it on every query);
with NVML on a real GPU in the tests marked requires-gpu, which skip, with
the reason, where there is none."""

import json
import os
import subprocess
import sys
import time

import grpc
import pytest

import scrape
import serverproc

MIB = 1 << 20
GIB = 1 << 30


def impossible_pid():
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1000


def wait_state(pid, letter, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == letter:
                return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never reached state {letter}")


class FakeGpu:
    """The fake driver file: cpu:1 as an 8 GiB GPU."""

    def __init__(self, path):
        self.path = path
        self.write(free=8 * GIB, processes=[])

    def write(self, free, processes, total=8 * GIB):
        doc = {"devices": [{"device": "cpu:1", "driver": {
            "uuid": "GPU-11111111-2222-3333-4444-555555555555",
            "name": "Fake H100", "totalBytes": str(total),
            "usedBytes": str(total - free), "freeBytes": str(free),
            "processes": [{"pid": pid, "usedBytes": str(used)}
                          for pid, used in processes]}}]}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)  # the server never reads half a file


@pytest.fixture
def fake(tmp_path):
    return FakeGpu(str(tmp_path / "gpu.json"))


@pytest.fixture
def others():
    """A running process, a zombie and a gone pid."""
    sleeper = subprocess.Popen(["sleep", "300"])
    zombie = subprocess.Popen(["true"])
    wait_state(zombie.pid, "Z")  # exited, not reaped: defunct
    yield {"running": sleeper.pid, "defunct": zombie.pid,
           "gone": impossible_pid()}
    sleeper.kill()
    sleeper.wait()
    zombie.wait()


def model(pb, nbytes):
    return pb.ModelSpec(
        tensors=[pb.TensorSpec(name="w", shape=[nbytes // 4], dtype="float32")],
        init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
            zeros=pb.Zeros()))])


def test_fake_driver_report_lists_every_process_with_its_state(fake, others):
    args = [f"--fake_gpu_driver={fake.path}", "--admin_clients=ops",
            "--metrics_listen=127.0.0.1:0", "--log_level=info"]
    with serverproc.running_server(args, devices="cpu:2",
                                   cpu_capacity="1GiB") as srv:
        fake.write(free=5 * GIB, processes=[
            (srv.proc.pid, 300 * MIB),
            (others["running"], 1 * GIB),
            (others["defunct"], 1536 * MIB),
            (others["gone"], 512 * MIB)])
        stats = srv.stats("ops")
        assert [d.device for d in stats.devices] == ["cpu:0", "cpu:1"]
        assert not stats.devices[0].HasField("driver")
        d = stats.devices[1].driver
        assert d.uuid == "GPU-11111111-2222-3333-4444-555555555555"
        assert d.name == "Fake H100"
        assert (d.total_bytes, d.used_bytes, d.free_bytes) == \
            (8 * GIB, 3 * GIB, 5 * GIB)
        assert d.server_process_bytes == 300 * MIB
        assert d.caching_allocator_bytes == 0  # not a CUDA device
        procs = {p.pid: p for p in d.processes}
        assert srv.proc.pid not in procs  # the server is not an "other"
        assert set(procs) == {others["running"], others["defunct"],
                              others["gone"]}
        running = procs[others["running"]]
        assert (running.state, running.name, running.used_bytes) == \
            ("running", "sleep", 1 * GIB)
        zombie = procs[others["defunct"]]
        assert (zombie.state, zombie.name, zombie.used_bytes) == \
            ("defunct", "true", 1536 * MIB)
        gone = procs[others["gone"]]
        assert (gone.state, gone.name, gone.used_bytes) == ("gone", "", 512 * MIB)

        # Other processes are for admins; the figures are for everyone.
        mine = srv.stats("alice").devices[1].driver
        assert mine.free_bytes == 5 * GIB and len(mine.processes) == 0

        # The same view in the metrics.
        s = scrape.scrape(scrape.metrics_url(srv))
        for state, n, nbytes in (("running", 1, GIB), ("defunct", 1, 1536 * MIB),
                                 ("gone", 1, 512 * MIB)):
            assert scrape.value(s, "materializer_gpu_other_processes",
                                device="cpu:1", state=state) == n
            assert scrape.value(s, "materializer_gpu_other_process_bytes",
                                device="cpu:1", state=state) == nbytes
        assert scrape.value(s, "materializer_gpu_free_bytes",
                            device="cpu:1") == 5 * GIB
        assert scrape.value(s, "materializer_gpu_server_process_bytes",
                            device="cpu:1") == 300 * MIB

        # The file changes under a running server: the next call sees it.
        fake.write(free=7 * GIB, processes=[])
        assert srv.stats("ops").devices[1].driver.free_bytes == 7 * GIB


def test_admission_refuses_what_the_driver_says_is_not_free(fake):
    args = [f"--fake_gpu_driver={fake.path}", "--gpu_free_headroom=16MiB"]
    with serverproc.running_server(args, devices="cpu:2",
                                   cpu_capacity="1GiB") as srv:
        pb = srv.pb
        # Another process holds all but 80 MiB of "the GPU": the ledger
        # (512 MiB free on cpu:1) would admit 96 MiB; the driver does not.
        fake.write(free=80 * MIB, processes=[(impossible_pid(), 8 * GIB - 80 * MIB)])
        req = pb.MaterializeRequest(model=model(pb, 96 * MIB),
                                    placement=pb.Placement(device="cpu:1"))
        with pytest.raises(grpc.RpcError) as e:
            srv.materialize(req, "alice")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        msg = e.value.details()
        assert "cpu:1" in msg, msg
        assert "needs 96.00 MiB (100663296 bytes)" in msg, msg
        assert "GPU driver reports only 80.00 MiB (83886080 bytes) free" in msg, msg
        assert "16.00 MiB (16777216 bytes) of it kept as headroom" in msg, msg
        srv.assert_idle("alice")  # nothing allocated, nothing counted

        # Plan says the same before anyone tries.
        plan = srv.stub.Plan(pb.PlanRequest(model=model(pb, 96 * MIB)),
                             metadata=srv.md("alice"), timeout=60)
        fits = {f.device: (f.fits, f.available_bytes) for f in plan.devices}
        assert fits["cpu:1"] == (False, 64 * MIB)
        assert fits["cpu:0"] == (True, 512 * MIB)

        # "auto" goes where there is room.
        req.placement.device = "auto"
        resp = srv.materialize(req, "alice")
        assert resp.device == "cpu:0"
        srv.release(resp.handle, "alice")

        # Once the other process lets go, cpu:1 admits it.
        fake.write(free=8 * GIB, processes=[])
        req.placement.device = "cpu:1"
        resp = srv.materialize(req, "alice")
        assert resp.device == "cpu:1"
        srv.release(resp.handle, "alice")
        srv.assert_idle("alice")


def test_bad_fake_driver_file_is_refused_at_start(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"devices": [{"device": "cpu:1"}]}')
    with pytest.raises(pytest.fail.Exception) as failed:
        with serverproc.running_server([f"--fake_gpu_driver={path}"]):
            pass
    assert 'needs "device" and "driver"' in str(failed.value)


# --- requires-gpu: NVML on a real device -------------------------------------

def cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("requires-gpu: no CUDA device visible to torch")
    try:
        import ctypes
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        pytest.skip(f"requires-gpu: NVML not loadable ({e})")
    return torch


HOLDER = """
import os, sys, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def hold_gpu_memory(nbytes):
    """A separate process holding `nbytes` on cuda:0 until its stdin
    closes."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(nbytes)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline()
    assert line.strip().isdigit(), "the holder process did not start"
    return p


def release_holder(p):
    p.stdin.close()
    p.wait(timeout=60)


def test_requires_gpu_nvml_reports_server_and_other_processes():
    cuda_or_skip()
    with serverproc.running_server(["--admin_clients=ops"],
                                   devices="cuda:0") as srv:
        pb = srv.pb
        before = srv.stats("ops").devices[0].driver
        assert before.uuid.startswith("GPU-"), before.uuid
        assert before.total_bytes > 0
        assert before.used_bytes + before.free_bytes <= before.total_bytes
        resp = srv.materialize(pb.MaterializeRequest(
            model=model(pb, GIB), placement=pb.Placement(device="cuda:0")),
            "alice")
        holder = hold_gpu_memory(2 * GIB)
        try:
            after = srv.stats("ops").devices[0].driver
            assert after.server_process_bytes >= \
                before.server_process_bytes + GIB
            procs = {p.pid: p for p in after.processes}
            assert holder.pid in procs, list(procs)
            mine = procs[holder.pid]
            assert mine.state == "running"
            assert mine.name.startswith("python"), mine.name
            assert mine.used_bytes >= 2 * GIB
            assert srv.proc.pid not in procs
        finally:
            release_holder(holder)
            srv.release(resp.handle, "alice")


def test_requires_gpu_admission_sees_memory_other_processes_hold():
    cuda_or_skip()
    with serverproc.running_server(["--gpu_free_headroom=512MiB"],
                                   devices="cuda:0") as srv:
        pb = srv.pb
        free = srv.stats().devices[0].driver.free_bytes
        # Leave 3 GiB free, then ask for 4 GiB: the ledger would admit it.
        holder = hold_gpu_memory(free - 3 * GIB)
        req = pb.MaterializeRequest(model=model(pb, 4 * GIB),
                                    placement=pb.Placement(device="cuda:0"))
        try:
            with pytest.raises(grpc.RpcError) as e:
                srv.materialize(req, "alice")
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "GPU driver reports only" in e.value.details()
            assert "cuda:0" in e.value.details()
            srv.assert_idle("alice")
        finally:
            release_holder(holder)
        resp = srv.materialize(req, "alice")
        srv.release(resp.handle, "alice")
