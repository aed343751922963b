#!/usr/bin/env python3
"""Portable-init throughput (GB/s) next to torch.nn.init and memset.

For normal and uniform in float32 and bfloat16 on one buffer of --gib GiB
(default 1), in one run on one machine:

  portable  FillPortable (server/init/portable) on the CPU, timed inside
            //server/init/portable:portable_bench, with --threads threads
  memset    memset of that same buffer, split across the same threads (the
            memory-bandwidth limit); also single-threaded for reference
  torch     torch.nn.init.normal_(t, 0, 0.02) / uniform_(t, -0.1, 0.1) on a
            tensor of the same size, in this process, torch.set_num_threads
            at the same count

Each case gets one untimed warm-up and --reps timed repetitions; medians are
reported, and ratios against torch and memset from the same run. The bench
binary also reports its CPU time, so "GB/s per core" shows what the kernel
does independently of how busy the machine is.

    bazel build //server/init/portable:portable_bench
    .venv/bin/python bench/portable_throughput.py            # print the table
    .venv/bin/python bench/portable_throughput.py --write    # ... and update bench/RESULTS.md

Targets (issue 4): float32 normal >= 3x torch and within 2x of memset;
bfloat16 no slower per byte than float32.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run as bench_run  # noqa: E402  (git_commit, write_results)
DEFAULT_BENCH = os.path.join(REPO, "bazel-bin", "server", "init", "portable",
                             "portable_bench")
CASES = [("normal", "float32"), ("normal", "bfloat16"),
         ("uniform", "float32"), ("uniform", "bfloat16")]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MARK = "bench/portable_throughput.py"


def machine():
    cpu, ram = platform.processor() or "unknown CPU", "unknown RAM"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = next(int(line.split()[1]) for line in f
                       if line.startswith("MemTotal:"))
            ram = f"{kib / (1 << 20):.1f} GiB RAM"
    except (OSError, StopIteration):
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = "AVX-512F" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    return {"cpu": cpu, "cores": os.cpu_count(), "ram": ram, "isa": isa}


def run_bench(binary, nbytes, threads, reps):
    cases = ",".join(f"{d}:{t}" for d, t in CASES)
    out = subprocess.run(
        [binary, f"--bytes={nbytes}", f"--threads={threads}", f"--reps={reps}",
         f"--cases={cases}"], capture_output=True, text=True, check=True).stdout
    return {r["case"]: r for r in (json.loads(line) for line in out.splitlines())}


def time_torch(nbytes, threads, reps):
    torch.set_num_threads(threads)
    results = {}
    for dist, dtype in CASES:
        t = torch.empty(nbytes // torch.empty((), dtype=TORCH_DTYPES[dtype]).element_size(),
                        dtype=TORCH_DTYPES[dtype])
        t.zero_()  # fault the pages in
        if dist == "normal":
            fn = lambda: torch.nn.init.normal_(t, 0.0, 0.02)  # noqa: E731
        else:
            fn = lambda: torch.nn.init.uniform_(t, -0.1, 0.1)  # noqa: E731
        fn()
        seconds = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        results[f"{dist}/{dtype}"] = seconds
        del t
    return results


def gbps(nbytes, seconds):
    return nbytes / statistics.median(seconds) / 1e9


def table(nbytes, bench, torch_s):
    memset = gbps(nbytes, bench["memset"]["seconds"])
    memset1 = gbps(nbytes, bench["memset_1thread"]["seconds"])
    path = next(iter(r["path"] for r in bench.values() if r["path"] != "-"))
    lines = [
        f"Median of the repetitions; 1 GB = 10^9 bytes. memset: {memset:.1f} GB/s "
        f"with the same threads ({memset1:.1f} GB/s on one thread). CPU path: {path}.",
        "",
        "| case | portable GB/s | per core GB/s | torch.nn.init GB/s | memset GB/s "
        "| portable / torch | portable / memset |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    per_byte = {}
    for dist, dtype in CASES:
        name = f"{dist}/{dtype}"
        r = bench[name]
        ours = gbps(nbytes, r["seconds"])
        per_core = nbytes / statistics.median(r["cpu_seconds"]) / 1e9
        theirs = gbps(nbytes, torch_s[name])
        per_byte[name] = ours
        lines.append(f"| {name} | {ours:.2f} | {per_core:.2f} | {theirs:.2f} | "
                     f"{memset:.1f} | **{ours / theirs:.1f}x** | {ours / memset:.2f} |")
    f32 = per_byte["normal/float32"]
    lines += [
        "",
        "Targets: float32 normal >= 3x torch: "
        f"{'met' if f32 / gbps(nbytes, torch_s['normal/float32']) >= 3 else 'NOT met'}"
        f" ({f32 / gbps(nbytes, torch_s['normal/float32']):.1f}x); within 2x of memset: "
        f"{'met' if f32 * 2 >= memset else 'NOT met'} (memset / portable = "
        f"{memset / f32:.1f}); bfloat16 per byte vs float32: normal "
        f"{per_byte['normal/bfloat16'] / f32:.2f}, uniform "
        f"{per_byte['uniform/bfloat16'] / per_byte['uniform/float32']:.2f} "
        f"({'met' if per_byte['normal/bfloat16'] >= f32 and per_byte['uniform/bfloat16'] >= per_byte['uniform/float32'] else 'NOT met'}).",
    ]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="buffer size in GiB")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads on both sides (default: all cores)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bench", default=os.environ.get("MATERIALIZER_PORTABLE_BENCH",
                                                      DEFAULT_BENCH),
                    help="the portable_bench binary")
    ap.add_argument("--write", action="store_true",
                    help="also replace this machine's section of bench/RESULTS.md")
    args = ap.parse_args()
    if not os.path.exists(args.bench):
        sys.exit(f"{args.bench} not found: bazel build "
                 "//server/init/portable:portable_bench (or pass --bench)")
    nbytes = int(args.gib * (1 << 30)) // 64 * 64
    command = " ".join(["bench/portable_throughput.py"] + sys.argv[1:])

    print(f"portable_bench: {args.gib} GiB, {args.threads} threads, {args.reps} reps",
          file=sys.stderr)
    load_before = os.getloadavg()[0]
    bench = run_bench(args.bench, nbytes, args.threads, args.reps)
    print("torch.nn.init in-process", file=sys.stderr)
    torch_s = time_torch(nbytes, args.threads, args.reps)
    body_table = table(nbytes, bench, torch_s)
    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(body_table)
    print(load, file=sys.stderr)

    if args.write:
        mach = machine()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-",
                     f"{mach['cpu']} {mach['cores']}c".lower()).strip("-")
        body = "\n".join([
            f"## Portable init throughput: {mach['cpu']}, {mach['cores']} cores, "
            f"{mach['ram']}",
            "",
            f"- command: `.venv/bin/python {command}`",
            f"- date: {date}",
            f"- machine: {mach['cpu']} ({mach['cores']} cores, {mach['isa']}), "
            f"{mach['ram']}, {platform.system()} {platform.release()}",
            f"- software: torch {torch.__version__}, Python {platform.python_version()}, "
            f"commit {bench_run.git_commit()}",
            f"- buffer: {nbytes:,} bytes; threads: {args.threads} on both sides "
            "(FillOptions.threads; torch.set_num_threads); 1-minute " + load,
            "",
            body_table,
        ])
        bench_run.write_results(key, body, mark=MARK)
        print(f"updated {os.path.relpath(bench_run.RESULTS)}", file=sys.stderr)


if __name__ == "__main__":
    main()
