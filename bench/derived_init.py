#!/usr/bin/env python3
"""Derived inits against the plain normal fill, same run, both RNG modes.

Each case is one Materialize of identical tensors (64 MiB by default),
timed by the server's init phase (PhaseTimings.init_us). Cases alternate
within each repetition (normal, then every derived case, in a fresh order
each time), so machine noise hits them alike; reported: the median of the
repetitions (min-max) and the ratio of each derived case's bandwidth to the
normal fill's of the same RNG mode (>= 0.5 is the goal).

    .venv/bin/python bench/derived_init.py            # print the table
    .venv/bin/python bench/derived_init.py --write    # ... and add it to bench/RESULTS.md
"""

import argparse
import datetime
import json
import math
import os
import platform
import random
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run as bench_run  # noqa: E402  (Service, machine, git_commit, write_results)

SEED = 99
DT_OPS = [
    {"kind": "MUL", "x": 0, "c": math.log(0.1) - math.log(0.001)},
    {"kind": "ADD", "x": 1, "c": math.log(0.001)},
    {"kind": "EXP", "x": 2},
    {"kind": "CLAMP", "x": 3, "min": 1e-4},
    {"kind": "NEG", "x": 4},
    {"kind": "EXPM1", "x": 5},
    {"kind": "NEG", "x": 6},
    {"kind": "LOG", "x": 7},
    {"kind": "ADD", "x": 4, "y": 8},
]

# label -> tensor JSON for tensor i (shape [rows, 1024] float32)
CASES = {
    "normal (baseline)": lambda n, s: {"name": n, "shape": s, "dtype": "float32",
                                       "init": {"normal": {"std": 0.02}}},
    "A_log = log(uniform(1, 16))": lambda n, s: {
        "name": n, "shape": s, "dtype": "float32",
        "initSteps": [{"init": {"uniform": {"a": 1, "b": 16}},
                       "map": {"ops": [{"kind": "LOG", "x": 0}]}}]},
    "dt bias (9 ops over uniform)": lambda n, s: {
        "name": n, "shape": s, "dtype": "float32",
        "initSteps": [{"init": {"uniform": {}}, "map": {"ops": DT_OPS}}]},
    "weight norm (v normal + g = norm(v))": None,  # two tensors, built below
}


def request(label, count, rows, rng):
    tensors = []
    for i in range(count):
        name = f"t{i}"
        if CASES[label] is None:
            tensors.append({"name": f"{name}.v", "shape": [rows, 1024], "dtype": "float32",
                            "init": {"normal": {"std": 0.02}}})
            tensors.append({"name": f"{name}.g", "shape": [rows, 1], "dtype": "float32",
                            "init": {"normOf": {"tensor": f"{name}.v", "dim": 0}}})
        else:
            tensors.append(CASES[label](name, [rows, 1024]))
    return {"model": {"tensors": tensors, "seed": str(SEED), "rng": rng}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rows", type=int, default=1024, help="each tensor is [rows, 1024] float32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    command = " ".join([".venv/bin/python", "bench/derived_init.py"]
                       + [shlex.quote(a) for a in sys.argv[1:]])
    mach = bench_run.machine()
    svc = bench_run.Service(args.server, args.proto, args.threads)
    labels = list(CASES)
    modes = ["RNG_MODE_PORTABLE", "RNG_MODE_TORCH"]
    times = {(m, lab): [] for m in modes for lab in labels}
    reqs = {}
    try:
        for m in modes:
            for lab in labels:
                reqs[(m, lab)] = svc.json_format.Parse(
                    json.dumps(request(lab, args.tensors, args.rows, m)),
                    svc.pb.MaterializeRequest())
                svc.materialize(reqs[(m, lab)])  # warm-up
        rng = random.Random(7)
        for _ in range(args.reps):
            order = [(m, lab) for m in modes for lab in labels]
            rng.shuffle(order)
            for key in order:
                _, phases = svc.materialize(reqs[key])
                times[key].append(phases["init"])
        svc.check_idle()
    finally:
        svc.stop()
    nbytes = args.tensors * args.rows * 1024 * 4
    lines = [
        f"{args.tensors} tensors of [{args.rows}, 1024] float32 per case "
        f"({nbytes / (1 << 20):,.0f} MiB; the weight-norm case adds its g tensors, "
        "which are not counted); server init phase, median of "
        f"{args.reps} interleaved repetitions (min-max); ratio = case GB/s / "
        "normal GB/s in the same mode.",
        "",
        "| mode | case | init s | GB/s | ratio to normal |",
        "|---|---|---:|---:|---:|",
    ]
    for m in modes:
        base = bench_run.med(times[(m, labels[0])])
        for lab in labels:
            t = times[(m, lab)]
            med = bench_run.med(t)
            lines.append(f"| {m.split('_')[-1].lower()} | {lab} | {med:.3f} "
                         f"({min(t):.3f}-{max(t):.3f}) | {nbytes / med / 1e9:.2f} | "
                         f"**{base / med:.2f}** |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        body = "\n".join([
            f"## Derived inits against the normal fill: {mach['cpu']}, {mach['cores']} cores",
            "",
            f"- command: `{command}`",
            f"- date: {date}",
            f"- machine: {mach['cpu']} ({mach['cores']} cores), {mach['ram']}, "
            f"{platform.system()} {platform.release()}",
            f"- software: commit {bench_run.git_commit()}; {args.threads} server threads",
            "",
            table,
        ])
        bench_run.write_results("derived-init", body, mark="bench/derived_init.py")
        print(f"updated {os.path.relpath(bench_run.RESULTS)}", file=sys.stderr)


if __name__ == "__main__":
    main()
