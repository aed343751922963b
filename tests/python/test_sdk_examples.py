"""The trainer scripts in examples/ run against a server (their smallest
sizes) and leave nothing held."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.parametrize("script,expect", [
    ("torch_module.py", "temperature 2.65926"),
    ("huggingface.py", "loss at init"),
    ("sharded.py", "shards of 2 ranks add up to model fingerprint"),
])
def test_example(server, script, expect):
    # PYTHONFAULTHANDLER: a rank that dies of a signal prints every thread's
    # Python stack, so a failure here says where it happened.
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), PYTHONFAULTHANDLER="1")
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", script),
                          "--server", server.address], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, (f"exit {out.returncode}\nstdout:\n{out.stdout[-2000:]}"
                                 f"\nstderr:\n{out.stderr[-4000:]}")
    assert expect in out.stdout
    if script == "sharded.py":
        lines = out.stdout.splitlines()
        combined = next(l for l in lines if "add up to" in l).split()[-1]
        single = next(l for l in lines if "in one process" in l).split()[-1]
        assert combined == single
    server.assert_idle()
