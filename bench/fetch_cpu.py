#!/usr/bin/env python3
"""CPU seconds per 4 GiB over loopback, to see how much of the machine a
fetch needs: raw TCP (bench/fetch_throughput.py's sender and receiver
threads, in this process) against the C++ client (bench/fetch_discard)
fetching a fresh handle with a cold file digest (the server hashes the
file as it streams) and again with the digest cached. Per path: the median
over --reps interleaved repetitions of the wall time, the server's CPU
seconds (/proc/PID/stat), the client's (its rusage) and this process's,
and their sum in cores (CPU seconds / wall).

    bazel build //server:materializerd //bench:fetch_discard //proto:materializer_py
    .venv/bin/python bench/fetch_cpu.py [--reps 5]
"""

import argparse
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
    args = ap.parse_args()
    nbytes = 4 << 30
    rows = {}
    with serverproc.running_server(cpu_capacity="6GiB") as server:
        pid = server.proc.pid
        req = server.parse_request(json.dumps({"model": {"tensors": [
            {"name": "w", "shape": [4, 1024, 1024, 256], "dtype": "float32"}],
            "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}))
        for _ in range(args.reps):
            handle = server.materialize(req, client="bench").handle
            fetch = lambda: ft.discard_fetch(server, handle, "safetensors")  # noqa: E731
            for name, run in (("C++ client, cold digest", fetch),
                              ("raw TCP", lambda: ft.raw_tcp(nbytes)),
                              ("C++ client, cached digest", fetch)):
                before = (process_cpu(pid), children_cpu(), time.process_time())
                start = time.perf_counter()
                run()
                wall = time.perf_counter() - start
                after = (process_cpu(pid), children_cpu(), time.process_time())
                rows.setdefault(name, []).append(
                    (wall, *(b - a for a, b in zip(before, after))))
            server.release(handle, client="bench")
    print("| path | wall s | server CPU s | client CPU s | this process CPU s | cores |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, xs in rows.items():
        med = [statistics.median(x[i] for x in xs) for i in range(4)]
        total = sum(med[1:])
        print(f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} "
              f"| {total / med[0]:.2f} |")


if __name__ == "__main__":
    main()
