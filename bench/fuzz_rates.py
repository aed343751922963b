#!/usr/bin/env python3
"""Executions per second of every fuzz target, each on one core: the target
runs for --seconds from a copy of its committed corpus (fuzz/corpus/TARGET),
with the flags ./dev fuzz gives it (fuzz/run.py), as many targets at once as
there are cores, and libFuzzer's own count (stat::number_of_executed_units
over the wall time, corpus loading included) is reported.

    ./dev fuzz all 1 && .venv/bin/python bench/fuzz_rates.py [--seconds 60] [--write]

(the first command builds the targets with clang; --bin-dir defaults to
where it puts them).
"""

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import run as bench_run  # noqa: E402  (bench/run.py: machine(), write_results())
import importlib.util  # noqa: E402

# fuzz/run.py (the flags ./dev fuzz uses), under a name of its own.
_spec = importlib.util.spec_from_file_location("fuzz_run", os.path.join(REPO, "fuzz", "run.py"))
fuzz_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_run)


def measure(binary, target, seconds):
    work = tempfile.mkdtemp(prefix=f"rate-{target}-")
    corpus = os.path.join(work, "corpus")
    shutil.copytree(os.path.join(REPO, "fuzz", "corpus", target), corpus)
    cmd = [binary, *fuzz_run.FLAGS.get(target, []), *fuzz_run.COMMON,
           f"-max_total_time={seconds}", f"-artifact_prefix={work}/", corpus]
    env = dict(os.environ, **fuzz_run.SANITIZER_ENV)
    t0 = time.monotonic()
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace").stdout
    wall = time.monotonic() - t0
    shutil.rmtree(work, ignore_errors=True)
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
    crashed = "ERROR: libFuzzer" in out or "SUMMARY:" in out
    return target, int(m.group(1)) if m else 0, wall, crashed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--bin-dir", default=os.path.join(
        REPO, ".build", "bazel-asan", "execroot", "materializer", "bazel-out", "k8-dbg",
        "bin", "fuzz"))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args()
    targets = args.targets or sorted(os.listdir(os.path.join(REPO, "fuzz", "corpus")))
    command = " ".join([".venv/bin/python", "bench/fuzz_rates.py"]
                       + [shlex.quote(a) for a in sys.argv[1:]])
    cores = os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=cores) as pool:
        results = list(pool.map(
            lambda t: measure(os.path.join(args.bin_dir, t), t, args.seconds), targets))
    lines = [f"Each target for {args.seconds} s from its committed corpus, {cores} at a "
             "time (one per core), with ./dev fuzz's flags; executions / wall seconds "
             "(loading the corpus included).", "",
             "| target | executions | seconds | executions per second | finding |",
             "|---|---:|---:|---:|---|"]
    for target, n, wall, crashed in results:
        lines.append(f"| {target} | {n:,} | {wall:.0f} | **{n / wall:,.0f}** | "
                     f"{'yes' if crashed else 'none'} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        mach = bench_run.machine()
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-", f"fuzz {mach['cpu']} {mach['cores']}c".lower())
        body = "\n".join([f"## Fuzz targets: {mach['cpu']}, {mach['cores']} cores", "",
                          f"- command: `{command}`", f"- date: {date}",
                          f"- commit {bench_run.git_commit()}", "", table])
        bench_run.write_results(key.strip("-"), body, mark="bench/fuzz_rates.py")


if __name__ == "__main__":
    main()
