#!/usr/bin/env python3
"""Init throughput per scheme: the service next to in-process PyTorch.

For each init scheme, one request of identical tensors (64 MiB by default)
is materialized through materializerd (sync Materialize, then Release), and
the same tensors are produced in this process with the Python expressions
of docs/init.md (tests/python/matutil.py: `reference`, `reset_module`):
`torch.empty` + the `torch.nn.init` call with the tensor's own generator,
one tensor after the other. Both sides run in the same run, on the same
machine, with the same thread count. Reported per scheme: GB/s of tensor
bytes for the server's init phase (PhaseTimings.init_us), for the whole
round trip as the client sees it, and in-process, plus the ratio service
round trip / in-process (< 1: the service is faster).

    .venv/bin/python bench/init_throughput.py            # print the table
    .venv/bin/python bench/init_throughput.py --write    # ... and add it to bench/RESULTS.md
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import run as bench_run  # noqa: E402  (Service, machine, git_commit, write_results)
import matutil  # noqa: E402  (the Python reference of every scheme)

SEED = 1234

# (label, oneof case, params, shape, dtype, module type for module_default)
CASES = [
    ("zeros", "zeros", {}, [1024, 1024], "float32"),
    ("constant", "constant", {"val": 0.5}, [1024, 1024], "float32"),
    ("empty", "empty", {}, [1024, 1024], "float32"),
    ("uniform", "uniform", {"a": -0.1, "b": 0.1}, [1024, 1024], "float32"),
    ("normal", "normal", {"std": 0.02}, [1024, 1024], "float32"),
    ("normal bf16", "normal", {"std": 0.02}, [1024, 1024], "bfloat16"),
    ("trunc_normal", "trunc_normal", {"std": 0.02}, [1024, 1024], "float32"),
    ("trunc_normal bf16", "trunc_normal", {"std": 0.02}, [1024, 1024], "bfloat16"),
    ("xavier_uniform", "xavier_uniform", {}, [1024, 1024], "float32"),
    ("xavier_normal", "xavier_normal", {}, [1024, 1024], "float32"),
    ("kaiming_uniform", "kaiming_uniform", {"a": 5 ** 0.5}, [1024, 1024], "float32"),
    ("kaiming_normal", "kaiming_normal", {"nonlinearity": "relu"}, [1024, 1024], "float32"),
    ("orthogonal", "orthogonal", {}, [1024, 1024], "float32"),
    ("eye", "eye", {}, [1024, 1024], "float32"),
    ("dirac", "dirac", {}, [64, 64, 16, 16], "float32"),
    ("sparse", "sparse", {"sparsity": 0.1}, [1024, 1024], "float32"),
    ("arange", "arange", {}, [1024, 1024], "float32"),
    ("module_default Linear", "module_default", {}, [1024, 1024], "float32"),
    ("module_default Embedding", "module_default", {}, [1024, 1024], "float32"),
]


def module_for(label, shape, dtype):
    if label.endswith("Linear"):
        return "Linear", torch.nn.Linear(shape[1], shape[0], bias=False, dtype=dtype)
    return "Embedding", torch.nn.Embedding(shape[0], shape[1], dtype=dtype)


def build(case, count):
    """(request dict, [(name, shape, dtype)], nbytes, module type or None)."""
    label, scheme, params, shape, dtype = case
    key = re.sub(r"[^a-z0-9]+", "_", label)
    tensors, names = [], []
    mtype = None
    for i in range(count):
        if scheme == "module_default":
            mtype = "Linear" if label.endswith("Linear") else "Embedding"
            name = f"{key}.{i}.weight"
            tensors.append({"name": name, "shape": shape, "dtype": dtype,
                            "moduleType": mtype, "init": {scheme: params}})
        else:
            name = f"{key}.{i}"
            tensors.append({"name": name, "shape": shape, "dtype": dtype,
                            "init": {scheme: params}})
        names.append(name)
    numel = matutil.numel(shape)
    nbytes = count * numel * torch.empty((), dtype=matutil.TORCH_DTYPES[dtype]).element_size()
    # Compared with torch.nn.init in-process: torch mode.
    req = {"model": {"tensors": tensors, "seed": str(SEED),
                     "rng": "RNG_MODE_TORCH"}}
    return req, names, nbytes, mtype


def in_process(case, names):
    """Seconds to produce every tensor in this process, one after the other."""
    label, scheme, params, shape, dtype = case
    torch_dtype = matutil.TORCH_DTYPES[dtype]
    start = time.perf_counter()
    out = []
    for name in names:
        if scheme == "module_default":
            _, module = module_for(label, shape, torch_dtype)  # init'd once by torch: not timed below
            out.append(module)
        else:
            out.append(matutil.reference(shape, torch_dtype, scheme, params, SEED, name))
    if scheme == "module_default":
        # Module construction already ran reset_parameters() once with the
        # global generator; time only the documented reset.
        start = time.perf_counter()
        for name, module in zip(names, out):
            matutil.reset_module(module, SEED, name.rpartition(".")[0])
    return time.perf_counter() - start


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=16,
                    help="tensors per scheme (default %(default)s: 64 MiB of float32)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both sides (default: os.cpu_count())")
    ap.add_argument("--only", default="", help="comma list of scheme labels to run")
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--write", action="store_true",
                    help="also replace this machine's init-throughput section of bench/RESULTS.md")
    args = ap.parse_args()
    command = " ".join([".venv/bin/python", "bench/init_throughput.py"]
                       + [shlex.quote(a) for a in sys.argv[1:]])
    cases = [c for c in CASES if not args.only or c[0] in args.only.split(",")]
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    mach = bench_run.machine()
    print(f"# {mach['cpu']}, {mach['cores']} cores, {mach['ram']}; torch "
          f"{torch.__version__}, {args.threads} threads on both sides", file=sys.stderr)

    svc = bench_run.Service(args.server, args.proto, args.threads)
    rows = []
    try:
        for case in cases:
            req_dict, names, nbytes, _ = build(case, args.tensors)
            req = svc.json_format.Parse(json.dumps(req_dict), svc.pb.MaterializeRequest())
            walls, inits, cpus, inprocs = [], [], [], []
            for i in range(args.warmup + args.reps):
                wall, phases = svc.materialize(req)
                ip = in_process(case, names)
                if i >= args.warmup:
                    walls.append(wall)
                    inits.append(phases["init"])
                    cpus.append(phases["cpu"] / wall)
                    inprocs.append(ip)
            row = {"label": case[0], "shape": case[3], "dtype": case[4], "bytes": nbytes,
                   "wall": bench_run.med(walls), "init": bench_run.med(inits),
                   "cores": bench_run.med(cpus), "inproc": bench_run.med(inprocs)}
            rows.append(row)
            print(f"{case[0]}: service {row['wall']:.3f} s (init {row['init']:.3f} s), "
                  f"in-process {row['inproc']:.3f} s", file=sys.stderr)
        svc.check_idle()
    finally:
        svc.stop()

    lines = [
        f"{args.tensors} tensors per scheme; median of {args.reps} repetitions. GB/s = "
        "tensor bytes / seconds (1 GB = 1e9 bytes). Service init = the server's init "
        "phase; round trip = the Materialize call as the client sees it (validate, "
        "reserve, allocate, init, register, gRPC). Ratio = service round trip / "
        "in-process (< 1: the service is faster).",
        "",
        "| scheme | tensors | MiB | service init GB/s | service round trip GB/s "
        "| in-process GB/s | ratio | server cores used |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {args.tensors} x {r['shape']} {r['dtype']} | "
            f"{r['bytes'] / (1 << 20):,.0f} | {gbps(r['bytes'], r['init']):.2f} | "
            f"{gbps(r['bytes'], r['wall']):.2f} | {gbps(r['bytes'], r['inproc']):.2f} | "
            f"**{r['wall'] / r['inproc']:.2f}** | {r['cores']:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-", f"{mach['cpu']} {mach['cores']}c".lower()).strip("-")
        body = "\n".join([
            f"## Init throughput per scheme: {mach['cpu']}, {mach['cores']} cores, {mach['ram']}",
            "",
            f"- command: `{command}`",
            f"- date: {date}",
            f"- machine: {mach['cpu']} ({mach['cores']} cores), {mach['ram']}, "
            f"{platform.system()} {platform.release()}",
            f"- software: torch {torch.__version__}, Python {platform.python_version()}, "
            f"commit {bench_run.git_commit()}",
            f"- threads: {args.threads} on both sides; the server fills tensors in "
            "parallel (one task per tensor, each kernel on one thread), in-process runs "
            "tensor after tensor with the Python expressions of docs/init.md "
            "(orthogonal under torch.set_num_threads(1), as documented)",
            f"- server: `{bench_run.shown_command(svc.cmd)}`",
            "",
            table,
        ])
        bench_run.write_results(key, body, mark="bench/init_throughput.py")
        print(f"updated {os.path.relpath(bench_run.RESULTS)}", file=sys.stderr)


if __name__ == "__main__":
    main()
