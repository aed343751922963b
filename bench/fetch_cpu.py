#!/usr/bin/env python3
"""CPU seconds per 4 GiB over loopback, to see how much of the machine a
fetch needs: raw TCP (bench/fetch_throughput.py's sender and receiver
threads, in this process) against the C++ client (bench/fetch_discard)
fetching a fresh handle with a cold file digest (the server hashes the
file as it streams) and again with the digest cached. Per path: the median
over --reps interleaved repetitions of the wall time, the server's CPU
seconds (/proc/PID/stat), the client's (its rusage) and this process's,
and their sum in cores (CPU seconds / wall).

With --baseline-server (another build of materializerd, e.g. main's before
a change), a second server of that build runs beside the first, and each
repetition also fetches a fresh handle of its own with a cold digest, the
two builds taking turns at going first: a same-run comparison of the two
builds.

    bazel build //server:materializerd //bench:fetch_discard //proto:materializer_py
    .venv/bin/python bench/fetch_cpu.py [--reps 5] [--format torch]
        [--baseline-server PATH]
"""

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fetch_throughput as ft  # noqa: E402  (sets the binaries' defaults)
import serverproc  # noqa: E402  (tests/python, on the path through ft)


def process_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--format", default="safetensors",
                    choices=["safetensors", "torch", "raw"])
    ap.add_argument("--baseline-server", default=None,
                    help="another materializerd build, fetched cold beside")
    args = ap.parse_args()
    nbytes = 4 << 30
    rows = {}
    spec = json.dumps({"model": {"tensors": [
        {"name": "w", "shape": [4, 1024, 1024, 256], "dtype": "float32"}],
        "initRules": [{"pattern": "*", "init": {"ones": {}}}]}})
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            serverproc.running_server(cpu_capacity="6GiB"))
        baseline = None
        if args.baseline_server:
            baseline = stack.enter_context(serverproc.running_server(
                cpu_capacity="6GiB", binary=args.baseline_server))
        req = server.parse_request(spec)
        for rep in range(args.reps):
            # With a baseline, the two builds take turns at going first
            # (materialize and cold fetch): whichever goes first measured
            # slower on this VM, with the same binary on both sides.
            handles = {}
            order = [server] if baseline is None else (
                [server, baseline] if rep % 2 == 0 else [baseline, server])
            for s in order:
                handles[id(s)] = s.materialize(req, client="bench").handle
            cold = {
                id(server): ("C++ client, cold digest", server),
                id(baseline): ("C++ client, cold digest, baseline server",
                               baseline)}
            paths = [(*cold[id(s)], functools.partial(
                ft.discard_fetch, s, handles[id(s)], args.format))
                for s in order]
            paths += [("raw TCP", server, lambda: ft.raw_tcp(nbytes)),
                      ("C++ client, cached digest", server, functools.partial(
                          ft.discard_fetch, server, handles[id(server)],
                          args.format))]
            for name, source, run in paths:
                pid = source.proc.pid
                before = (process_cpu(pid), children_cpu(), time.process_time())
                start = time.perf_counter()
                run()
                wall = time.perf_counter() - start
                after = (process_cpu(pid), children_cpu(), time.process_time())
                rows.setdefault(name, []).append(
                    (wall, *(b - a for a, b in zip(before, after))))
            for s in order:
                s.release(handles[id(s)], client="bench")
    raw = statistics.median(x[0] for x in rows["raw TCP"])
    print("| path | wall s (min-max) | vs raw TCP | server CPU s | client CPU s "
          "| this process CPU s | cores |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, xs in rows.items():
        med = [statistics.median(x[i] for x in xs) for i in range(4)]
        walls = [x[0] for x in xs]
        total = sum(med[1:])
        print(f"| {name} | {med[0]:.2f} ({min(walls):.2f}-{max(walls):.2f}) "
              f"| {raw / med[0]:.0%} | {med[1]:.2f} | {med[2]:.2f} "
              f"| {med[3]:.2f} | {total / med[0]:.2f} |")


if __name__ == "__main__":
    main()
