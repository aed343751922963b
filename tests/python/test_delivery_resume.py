"""Resume after a killed client: `matctl fetch` SIGKILLed mid-transfer,
then `matctl fetch --resume`, gives a file identical to an uninterrupted
fetch, and matctl verifies (and prints) the digest."""

import json
import os
import signal
import subprocess
import time

import pytest

import serverproc

CLIENT = "resume-kill-test"
MATCTL = os.environ.get(
    "MATCTL", os.path.join(serverproc.REPO, "bazel-bin", "client", "matctl"))


def matctl(server, *args, **kw):
    return subprocess.run(
        [MATCTL, f"--server={server.address}", f"--client={CLIENT}", *args],
        capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_killed_fetch_resumes_to_the_identical_file(server, tmp_path, fmt):
    if not os.path.exists(MATCTL):
        pytest.fail(f"matctl not found at {MATCTL} (bazel build //client:matctl)")
    req = server.parse_request(json.dumps({"model": {"tensors": [
        {"name": "a.weight", "shape": [96, 1024, 1024], "dtype": "float32"},
        {"name": "b.bias", "shape": [1000], "dtype": "bfloat16"}],
        "initRules": [{"pattern": "*", "init": {"uniform": {}}}],
        "seed": "11"}}))
    handle = server.materialize(req, client=CLIENT).handle
    try:
        whole = tmp_path / f"whole.{fmt}"
        done = matctl(server, "fetch", handle, "-o", str(whole),
                      f"--format={fmt}")
        assert done.returncode == 0, done.stderr
        digest_line = done.stdout.splitlines()[-1]
        assert digest_line.startswith("digest xxh3-128:"), done.stdout

        out = tmp_path / f"killed.{fmt}"
        partial = str(out) + ".partial"
        size = os.path.getsize(whole)
        # Small chunks, so the kill lands mid-stream.
        proc = subprocess.Popen(
            [MATCTL, f"--server={server.address}", f"--client={CLIENT}",
             "fetch", handle, "-o", str(out), f"--format={fmt}",
             "--chunk_bytes=64KiB"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(partial) and os.path.getsize(partial) > size // 8:
                break
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got = os.path.getsize(partial)
        assert 0 < got < size, f"kill missed the transfer ({got} of {size})"
        assert not os.path.exists(out)

        resumed = matctl(server, "fetch", handle, "-o", str(out),
                         f"--format={fmt}", "--resume")
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.splitlines()[-1] == digest_line
        assert not os.path.exists(partial)
        with open(whole, "rb") as a, open(out, "rb") as b:
            while True:
                x, y = a.read(1 << 24), b.read(1 << 24)
                assert x == y
                if not x:
                    break
    finally:
        server.release(handle, client=CLIENT)
