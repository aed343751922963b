#!/usr/bin/env python3
"""Fetch throughput over loopback for a 4 GiB handle, next to a raw TCP
loopback stream of the same number of bytes and next to torch.save +
torch.load of the same state dict through a file, in one run, as ratios.

    bazel build //server:materializerd //client:matctl //bench:fetch_discard \
        //proto:materializer_py
    .venv/bin/python bench/fetch_throughput.py [--gib 4] [--dir /dev/shm] [--reps 5] [--write]

Two clients: `bench/fetch_discard` (the C++ client library; counts and
digests the bytes and drops them: the transport, next to raw TCP that also
discards) and `matctl fetch` (writes OUT.partial, verifies the XXH3-128
digest of every byte, renames: next to raw TCP whose receiver writes the
file), each with a cold digest cache (the server hashes the file as it
streams) and warm. Files go to
--dir (tmpfs by default, so no disk is measured; every path writes its
file there). The raw TCP stream sends the bytes from memory with sendall
and the receiver discards them with recv_into: the ceiling of loopback on
this machine; a second raw TCP stream sends the same number of distinct
bytes from a resident buffer, each read once, as the server reads its
arena (the first one's 4 MiB stays in the CPU's cache). Every path runs
in each of --reps interleaved repetitions (default 5; torch.save +
torch.load once, after them). Prints a Markdown
table; --write adds it to bench/RESULTS.md.
"""

import argparse
import datetime
import json
import os
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
os.environ.setdefault("MATERIALIZERD",
                      os.path.join(REPO, "bazel-bin", "server", "materializerd"))
os.environ.setdefault("MATERIALIZER_PY_PROTO",
                      os.path.join(REPO, "bazel-bin", "proto"))
MATCTL = os.path.join(REPO, "bazel-bin", "client", "matctl")
DISCARD = os.path.join(REPO, "bazel-bin", "bench", "fetch_discard")
GIB = 1 << 30
TCP_FROM_MEMORY = "raw TCP loopback, each byte read once from memory (discard)"


def raw_tcp(nbytes, buf=4 << 20, out=None, source=None):
    """Seconds to stream `nbytes` from memory over loopback TCP; the
    receiver discards them, or writes them to the file `out`. The sender
    sends one 4 MiB buffer over and over (it stays in the CPU's cache), or
    consecutive slices of `source` (a memoryview of at least `nbytes`
    resident bytes: memory read once, as the server reads its arena)."""
    payload = memoryview(bytearray(os.urandom(1 << 20)) * (buf >> 20))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    done = {}

    def receive():
        conn, _ = listener.accept()
        sink = bytearray(buf)
        view = memoryview(sink)
        got = 0
        f = open(out, "wb") if out else None
        while got < nbytes:
            n = conn.recv_into(view)
            if n == 0:
                break
            if f:
                f.write(view[:n])
            got += n
        if f:
            f.close()
            os.unlink(out)
        done["got"] = got
        conn.close()

    t = threading.Thread(target=receive)
    t.start()
    s = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    sent = 0
    while sent < nbytes:
        n = min(buf, nbytes - sent)
        s.sendall(payload[:n] if source is None else source[sent:sent + n])
        sent += n
    s.shutdown(socket.SHUT_WR)
    t.join()
    elapsed = time.perf_counter() - start
    s.close()
    listener.close()
    assert done["got"] == nbytes
    return elapsed


def raw_tcp_read_once(nbytes):
    """raw_tcp from a resident buffer of `nbytes` distinct bytes, each read
    once, as the server reads its arena. The buffer exists only during this
    measurement: held through the others, 4 GiB of it slowed the writes
    into tmpfs of every other path by up to 2x on this VM."""
    source = memoryview(bytearray(nbytes))  # zero-filled: resident
    source[:1 << 20] = os.urandom(1 << 20)
    try:
        return raw_tcp(nbytes, source=source)
    finally:
        source.release()


def matctl_fetch(server, handle, out, fmt):
    start = time.perf_counter()
    r = subprocess.run([MATCTL, f"--server={server.address}", "--client=bench",
                        "fetch", handle, "-o", out, f"--format={fmt}"],
                       capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    size = os.path.getsize(out)
    os.unlink(out)
    return elapsed, size


def discard_fetch(server, handle, fmt):
    """The C++ client fetching and discarding (verifying the digest)."""
    start = time.perf_counter()
    r = subprocess.run([DISCARD, f"--server={server.address}", "--client=bench",
                        f"--handle={handle}", f"--format={fmt}"],
                       capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0 or "(verified)" not in r.stdout:
        raise SystemExit(r.stderr or r.stdout)
    return elapsed, int(r.stdout.split()[0])


def torch_save_load(gib, path):
    import torch
    state = {"w": torch.ones(gib * GIB // 4, dtype=torch.float32)}
    start = time.perf_counter()
    torch.save(state, path)
    saved = time.perf_counter()
    loaded = torch.load(path, weights_only=True)
    end = time.perf_counter()
    assert loaded["w"].numel() == state["w"].numel()
    size = os.path.getsize(path)
    os.unlink(path)
    return saved - start, end - saved, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import serverproc

    nbytes = args.gib * GIB
    # Every repetition materializes a fresh handle (so its digests are
    # cold), fetches it cold in both formats, in an order of its own, then
    # runs the other paths in a shuffled order of their own: no path always
    # follows the same one, and every ratio compares medians of the same
    # repetitions.
    times = {}
    sizes = {}

    def record(name, size, t):
        times.setdefault(name, []).append(t)
        sizes[name] = size

    cap = f"{args.gib + 2}GiB"
    out = os.path.join(args.dir, "fetch_bench.out")
    with serverproc.running_server(cpu_capacity=cap) as server:
        req = server.parse_request(json.dumps({"model": {"tensors": [
            {"name": "w", "shape": [args.gib, 1024, 1024, 256],
             "dtype": "float32"}],
            "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}))
        for rep in range(args.reps):
            rng = random.Random(rep)
            handle = server.materialize(req, client="bench").handle
            cold = [("FetchWeights, C++ client discards (cold digest)",
                     lambda: discard_fetch(server, handle, "safetensors")),
                    ("matctl fetch --format=torch, cold digest",
                     lambda: matctl_fetch(server, handle, out, "torch"))]
            rng.shuffle(cold)
            for name, run in cold:
                t, size = run()
                record(name, size, t)
            paths = [
                ("raw TCP loopback (sendall -> recv_into, discard)",
                 lambda: (raw_tcp(nbytes), nbytes)),
                (TCP_FROM_MEMORY, lambda: (raw_tcp_read_once(nbytes), nbytes)),
                ("raw TCP loopback, receiver writes the file",
                 lambda: (raw_tcp(nbytes, out=os.path.join(args.dir, "tcp_bench.out")),
                          nbytes)),
                ("FetchWeights, C++ client discards (cached digest)",
                 lambda: discard_fetch(server, handle, "safetensors")),
                ("matctl fetch --format=safetensors, cached digest",
                 lambda: matctl_fetch(server, handle, out, "safetensors")),
                ("matctl fetch --format=torch, cached digest",
                 lambda: matctl_fetch(server, handle, out, "torch")),
            ]
            rng.shuffle(paths)
            for name, run in paths:
                t, size = run()
                record(name, size, t)
            server.release(handle, client="bench")
            print(f"rep {rep + 1}: " + ", ".join(
                f"{n.split(' (')[0][:28]} {times[n][-1]:.2f} s" for n in times),
                file=sys.stderr)
        save, load, size = torch_save_load(args.gib, os.path.join(args.dir, "bench.pt"))
        record("torch.save + torch.load (file)", size, save + load)

    med = statistics.median
    order = ["raw TCP loopback (sendall -> recv_into, discard)",
             TCP_FROM_MEMORY,
             "raw TCP loopback, receiver writes the file",
             "FetchWeights, C++ client discards (cold digest)",
             "FetchWeights, C++ client discards (cached digest)",
             "matctl fetch --format=safetensors, cached digest",
             "matctl fetch --format=torch, cold digest",
             "matctl fetch --format=torch, cached digest",
             "torch.save + torch.load (file)"]
    tcp_rate = nbytes / med(times[order[0]])
    memory_rate = nbytes / med(times[TCP_FROM_MEMORY])
    torch_rate = sizes[order[-1]] / med(times[order[-1]])
    lines = [f"{args.gib} GiB handle (one float32 tensor), files in {args.dir}; "
             f"{args.reps} interleaved repetitions, median seconds (min-max), GB/s at the "
             "median; ratios of medians (torch.save + load: one run, after them). "
             "vs raw TCP: against the sender resending one 4 MiB buffer (cache-hot); "
             "vs read once: against the sender reading a buffer of the handle's size "
             "once, as the server reads its arena.", "",
             "| path | bytes | seconds | GB/s | vs raw TCP | vs read once "
             "| vs torch.save+load |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in order:
        ts = times[name]
        rate = sizes[name] / med(ts)
        lines.append(f"| {name} | {sizes[name]:,} | {med(ts):.2f} ({min(ts):.2f}-{max(ts):.2f}) "
                     f"| {rate / 1e9:.2f} | **{rate / tcp_rate:.0%}** | "
                     f"**{rate / memory_rate:.0%}** | {rate / torch_rate:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import run as bench_run
        mach = bench_run.machine()
        command = " ".join([".venv/bin/python", "bench/fetch_throughput.py"]
                           + [shlex.quote(a) for a in sys.argv[1:]])
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-", f"fetch {mach['cpu']} {mach['cores']}c".lower())
        body = "\n".join([f"## Fetch throughput: {mach['cpu']}, {mach['cores']} cores, "
                          f"{mach['ram']}", "", f"- command: `{command}` "
                          "(or `./dev bench fetch --write`)", f"- date: {date}",
                          f"- commit {bench_run.git_commit()}", "", table])
        bench_run.write_results(key.strip("-"), body, mark="bench/fetch_throughput.py")


if __name__ == "__main__":
    main()
