#!/usr/bin/env python3
"""What checking a torch archive's CRC-32s costs a checkpoint load: a
torch.save file of --mib MiB (16 float32 tensors, each its own storage,
so every one is checked) loaded by Materialize from this build's server
and from --baseline-server (a build that does not check them), the two
taking turns at going first, --reps repetitions after one warm-up each.
Both servers run with --checkpoint_cache_bytes=0, so every load reads the
file (from the page cache, which the warm-up fills). Reports medians of
the server's checkpoint phase (PhaseTimings.checkpoint_us) and of the
round trip, and their ratio against the baseline.

    bazel build //server:materializerd //proto:materializer_py
    .venv/bin/python bench/torch_checkpoint_crc.py --baseline-server PATH
        [--mib 1024] [--reps 7]
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fetch_throughput  # noqa: E402,F401  (sets the binaries' defaults)
import serverproc  # noqa: E402  (tests/python, on the path through it)

import torch  # noqa: E402

CLIENT = "bench"
TENSORS = 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-server", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    numel = (args.mib << 20) // 4 // TENSORS
    with tempfile.TemporaryDirectory(prefix="crc-bench-") as root:
        folder = os.path.join(root, "model")
        os.mkdir(folder)
        torch.manual_seed(0)
        state = {f"layers.{i}.weight": torch.randn(numel)
                 for i in range(TENSORS)}
        torch.save(state, os.path.join(folder, "pytorch_model.bin"))
        del state
        spec = json.dumps({
            "model": {"tensors": [
                {"name": f"layers.{i}.weight", "shape": [numel],
                 "dtype": "float32"} for i in range(TENSORS)],
                "initRules": [{"pattern": "*", "init": {"zeros": {}}}]},
            "checkpoint": {"path": "models/model", "requireAll": True}})
        flags = (f"--checkpoint_roots=models={root}",
                 "--checkpoint_cache_bytes=0")
        with contextlib.ExitStack() as stack:
            servers = {
                "this build": stack.enter_context(serverproc.running_server(
                    extra_args=flags, cpu_capacity="6GiB")),
                "baseline": stack.enter_context(serverproc.running_server(
                    extra_args=flags, cpu_capacity="6GiB",
                    binary=args.baseline_server)),
            }
            rows = {name: [] for name in servers}

            def load(name):
                server = servers[name]
                req = server.parse_request(spec)
                start = time.perf_counter()
                resp = server.materialize(req, client=CLIENT)
                wall = time.perf_counter() - start
                server.release(resp.handle, client=CLIENT)
                assert resp.checkpoint.tensors_loaded == TENSORS
                return wall, resp.timings.checkpoint_us / 1e6

            for name in servers:
                load(name)  # warm-up: the page cache, the servers' pages
            names = list(servers)
            for rep in range(args.reps):
                for name in (names if rep % 2 == 0 else names[::-1]):
                    rows[name].append(load(name))
    base = [statistics.median(x[i] for x in rows["baseline"]) for i in (0, 1)]
    print(f"{args.mib} MiB torch.save file, {TENSORS} tensors; medians of "
          f"{args.reps} interleaved repetitions (min-max)")
    print("| server | checkpoint phase s | vs baseline | round trip s "
          "| vs baseline |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in rows.items():
        walls = [x[0] for x in xs]
        phases = [x[1] for x in xs]
        wall, phase = statistics.median(walls), statistics.median(phases)
        print(f"| {name} | {phase:.3f} ({min(phases):.3f}-{max(phases):.3f}) "
              f"| {phase / base[1]:.2f}x | {wall:.3f} "
              f"({min(walls):.3f}-{max(walls):.3f}) | {wall / base[0]:.2f}x |")


if __name__ == "__main__":
    main()
