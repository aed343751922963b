#!/usr/bin/env python3
"""Fetch throughput over loopback for a 4 GiB handle, next to a raw TCP
loopback stream of the same number of bytes and next to torch.save +
torch.load of the same state dict through a file, in one run, as ratios.

    bazel build //server:materializerd //client:matctl //bench:fetch_discard \
        //proto:materializer_py
    .venv/bin/python bench/fetch_throughput.py [--gib 4] [--dir /dev/shm]

Two clients: `bench/fetch_discard` (the C++ client library; counts and
digests the bytes and drops them: the transport, next to raw TCP that also
discards) and `matctl fetch` (writes OUT.partial, verifies the XXH3-128
digest of every byte, renames: next to raw TCP whose receiver writes the
file), each with a cold digest cache (the server hashes the file as it
streams) and warm. Files go to
--dir (tmpfs by default, so no disk is measured; every path writes its
file there). The raw TCP stream sends the bytes from memory with sendall
and the receiver discards them with recv_into: the ceiling of loopback on
this machine. Prints a Markdown table.
"""

import argparse
import json
import os
import platform
import socket
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


def raw_tcp(nbytes, buf=4 << 20, out=None):
    """Seconds to stream `nbytes` from memory over loopback TCP; the
    receiver discards them, or writes them to the file `out`."""
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
        s.sendall(payload[:n])
        sent += n
    s.shutdown(socket.SHUT_WR)
    t.join()
    elapsed = time.perf_counter() - start
    s.close()
    listener.close()
    assert done["got"] == nbytes
    return elapsed


def matctl_fetch(server, handle, out, fmt):
    start = time.perf_counter()
    r = subprocess.run([MATCTL, f"--server={server.address}", "--client=bench",
                        "fetch", handle, "-o", out, f"--format={fmt}",
                        "--chunk_bytes=4190208"],
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
    args = ap.parse_args()
    import serverproc

    nbytes = args.gib * GIB
    rows = []
    tcp = raw_tcp(nbytes)
    rows.append(("raw TCP loopback (sendall -> recv_into, discard)", nbytes, tcp))
    tcp_file = raw_tcp(nbytes, out=os.path.join(args.dir, "tcp_bench.out"))
    rows.append(("raw TCP loopback, receiver writes the file", nbytes, tcp_file))

    cap = f"{args.gib + 2}GiB"
    with serverproc.running_server(cpu_capacity=cap) as server:
        req = server.parse_request(json.dumps({"model": {"tensors": [
            {"name": "w", "shape": [args.gib, 1024, 1024, 256],
             "dtype": "float32"}],
            "initRules": [{"pattern": "*", "init": {"ones": {}}}]}}))
        handle = server.materialize(req, client="bench").handle
        out = os.path.join(args.dir, "fetch_bench.out")
        t, size = discard_fetch(server, handle, "safetensors")
        rows.append(("FetchWeights, C++ client discards (cold digest)", size, t))
        t, size = discard_fetch(server, handle, "safetensors")
        rows.append(("FetchWeights, C++ client discards (cached digest)", size, t))
        for fmt in ("safetensors", "torch"):
            t, size = matctl_fetch(server, handle, out, fmt)
            rows.append((f"matctl fetch --format={fmt}, cold digest", size, t))
            t, size = matctl_fetch(server, handle, out, fmt)
            rows.append((f"matctl fetch --format={fmt}, cached digest", size, t))
        server.release(handle, client="bench")

    save, load, size = torch_save_load(args.gib, os.path.join(args.dir, "bench.pt"))
    rows.append(("torch.save + torch.load (file)", size, save + load))

    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; {args.gib} GiB handle; files in {args.dir}")
    print()
    print("| path | bytes | seconds | GB/s | vs raw TCP | vs torch.save+load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    torch_rate = rows[-1][1] / rows[-1][2]
    tcp_rate = nbytes / tcp
    for name, size, t in rows:
        rate = size / t
        print(f"| {name} | {size} | {t:.2f} | {rate / 1e9:.2f} | "
              f"{rate / tcp_rate:.0%} | {rate / torch_rate:.2f}x |")
    print(f"\ntorch.save {save:.2f} s + torch.load {load:.2f} s")


if __name__ == "__main__":
    main()
