"""The co-located load hands the server's shared-memory pages over to the
trainer: the SDK maps them, the server releases the handle, and the
trainer keeps the pages. Those pages stay charged to the server's memory
(a tmpfs page belongs to the cgroup that first touched it), so the server
keeps counting them, as handed over, until no process maps them: a server
that forgot them admitted new handles into memory its container did not
have and was OOM-killed. Each test runs a real trainer process and reads
the server's ledger through GetStats."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

import serverproc

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
MIB = 1 << 20
MODEL_BYTES = 64 * MIB   # one float32 Linear(4096, 4096), no bias

TRAINER = textwrap.dedent("""
    import gc, os, sys
    sys.path.insert(0, {python!r})
    import torch, torch.nn as nn
    import materializer as mz
    with mz.meta_device():
        model = nn.Linear(4096, 4096, bias=False)
    mz.materialize(model, server={address!r}, transport="shm")
    with torch.no_grad():
        model.weight.add_(1.0)          # the first optimizer step writes it all
    print("loaded", flush=True)
    child = None
    for line in sys.stdin:
        command = line.strip()
        if command == "fork":
            read_end, write_end = os.pipe()
            child = os.fork()
            if child == 0:              # holds the inherited mapping until told
                os.close(write_end)
                os.read(read_end, 1)
                os._exit(0)
            os.close(read_end)
            print("forked", flush=True)
        elif command == "end-child":
            os.close(write_end)
            os.waitpid(child, 0)
            print("child ended", flush=True)
        elif command == "drop":
            del model
            gc.collect()
            print("dropped", flush=True)
""")


@pytest.fixture(scope="module")
def srv():
    with serverproc.running_server(cpu_capacity="160MiB") as s:
        yield s


class Trainer:
    def __init__(self, srv):
        code = TRAINER.format(python=PYTHON_DIR, address=srv.address)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.expect("loaded")

    def expect(self, word):
        line = self.proc.stdout.readline().strip()
        assert line == word, f"trainer said {line!r}, expected {word!r}"

    def say(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.expect(answer)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def end(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def handed_over(srv):
    s = srv.stats()
    assert s.handed_over_bytes == sum(d.handed_over_bytes for d in s.devices)
    return s.handed_over_bytes


def wait_for(srv, predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(handed_over(srv)):
            return True
        time.sleep(0.05)
    return predicate(handed_over(srv))


def test_a_released_handle_stays_counted_while_the_trainer_maps_it(srv):
    trainer = Trainer(srv)
    try:
        s = srv.stats()
        # The handle is released: no handle, nothing in use ...
        assert s.handles == 0 and s.in_use_bytes == 0 and s.reserved_bytes == 0
        # ... but the trainer's 64 MiB are the server's pages, counted.
        assert s.handed_over_bytes == MODEL_BYTES
        (client,) = s.clients
        assert client.handles == 0 and client.handed_over_bytes == MODEL_BYTES
        (cpu,) = [d for d in client.devices if d.device == "cpu"]
        assert cpu.handed_over_bytes == MODEL_BYTES
        # Still so a while later: the watcher does not let them go by time.
        time.sleep(0.5)
        assert handed_over(srv) == MODEL_BYTES
        # The trainer drops its model: the pages go, and so do the bytes.
        trainer.say("drop", "dropped")
        assert wait_for(srv, lambda b: b == 0), handed_over(srv)
        assert not srv.stats().clients
    finally:
        trainer.kill()
    srv.assert_idle()


def test_matctl_stats_shows_the_handed_over_bytes_per_device(srv):
    """An operator reading `matctl stats` sees where the memory counted
    against the capacity is: a HANDED OVER column while a trainer maps
    released pages, none once it lets go."""
    matctl = os.environ.get("MATCTL", os.path.join(serverproc.REPO, "bazel-bin", "client",
                                                   "matctl"))

    def stats():
        out = subprocess.run([matctl, f"--server={srv.address}", "stats"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    trainer = Trainer(srv)
    try:
        text = stats()
        header = next(line for line in text.splitlines() if line.startswith("DEVICE"))
        assert header.split()[-2:] == ["HANDED", "OVER"], text
        cpu = next(line for line in text.splitlines() if line.startswith("cpu "))
        assert cpu.split()[-2:] == ["64.00", "MiB"], text
        assert "handed over: 64.00 MiB" in text
        trainer.say("drop", "dropped")
        assert wait_for(srv, lambda b: b == 0), handed_over(srv)
        text = stats()
        assert "HANDED OVER" not in text and "handed over" not in text, text
    finally:
        trainer.kill()
    srv.assert_idle()


def test_a_killed_trainer_frees_its_handed_over_bytes(srv):
    trainer = Trainer(srv)
    assert handed_over(srv) == MODEL_BYTES
    trainer.kill()
    assert wait_for(srv, lambda b: b == 0), handed_over(srv)
    srv.assert_idle()


def test_handed_over_bytes_count_against_the_capacity(srv):
    """160 MiB of capacity, 64 MiB handed over: a 100 MiB handle does not
    fit (before, the server admitted it into memory its cgroup had given to
    the trainer), and fits once the trainer is gone."""
    req = srv.parse_request('{"model": {"tensors": [{"name": "w", "shape": [25600, 1024], '
                            '"dtype": "float32", "init": {"zeros": {}}}]}}')
    trainer = Trainer(srv)
    try:
        with pytest.raises(grpc.RpcError) as e:
            srv.materialize(req)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "64.00 MiB (67108864 bytes) of released handles are still mapped" in \
            e.value.details(), e.value.details()
        assert handed_over(srv) == MODEL_BYTES
    finally:
        trainer.end()   # stdin closed: the trainer exits, its mapping with it
    # Reserve sweeps first: no wait for the watcher.
    with srv.handle(req):
        pass
    srv.assert_idle()
    assert handed_over(srv) == 0


def test_a_forked_child_keeps_the_pages_counted(srv):
    """A data-loader worker forked after the load shares the mapping and
    the locked descriptor: the pages live until both have let go."""
    trainer = Trainer(srv)
    try:
        trainer.say("fork", "forked")
        trainer.say("drop", "dropped")
        time.sleep(0.3)   # three polls of the watcher
        assert handed_over(srv) == MODEL_BYTES
        trainer.say("end-child", "child ended")
        assert wait_for(srv, lambda b: b == 0), handed_over(srv)
    finally:
        trainer.kill()
    srv.assert_idle()
