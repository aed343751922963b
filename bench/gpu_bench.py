#!/usr/bin/env python3
"""GPU benchmarks of the prepared GPU run (tools/gpu-run), each a step run
in a child process by tools/gpu_checks.py, and the writer of their
section in bench/RESULTS.md:

  bench_init         portable init on the GPU (FillPortableCuda; float32 and
                     bfloat16 normal, uniform) in GB/s next to torch's CUDA
                     normal_/uniform_ on tensors of the same size and to
                     cudaMemset of the buffer (the write-bandwidth limit),
                     in one run (server/init/portable:portable_cuda_bench
                     for ours and the memset, CUDA events for torch)
  bench_materialize  Materialize of an example (llama-1b) on the GPU as a
                     client round trip (portable and torch RNG modes) next to
                     the same model in-process: meta module -> to_empty(cuda)
                     -> torch.nn.init per tensor with CUDA generators seeded
                     like torch mode, synchronized
  bench_fetch        fetch throughput (bench/fetch_discard, digest verified)
                     of a handle in a CUDA arena next to the same handle in a
                     CPU arena and to a plain device-to-pinned-host copy

Rehearsing on a CPU (tools/gpu-run --rehearse-cpu) the same code runs with
CPU devices, so the tables are made, but GPU figures are absent and the
steps say SKIP. Goals (issue 13): portable init >= 70% of the cudaMemset
bandwidth and ahead of torch's normal_.

    bench/gpu_bench.py --write OUT/gpu-run.json   # GPU section of RESULTS.md
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GIB = 1 << 30
MIB = 1 << 20
CLIENT = "gpu-bench"
INIT_CASES = [("normal", "float32"), ("normal", "bfloat16"),
              ("uniform", "float32"), ("uniform", "bfloat16")]
MARK = "bench/gpu_bench.py"
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


def median(xs):
    return statistics.median(xs)


def gbps(nbytes, seconds):
    return nbytes / median(seconds) / 1e9


def run_portable_cuda_bench(ctx, nbytes, reps, cases):
    """{case: seconds list} and the device line, or (None, the reason)."""
    cmd = [str(ctx.bin / "portable_cuda_bench"), f"--bytes={nbytes}",
           f"--reps={reps}", f"--cases={','.join(f'{d}:{t}' for d, t in cases)}"]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         timeout=max(5, ctx.left() - 10))
    print(" ".join(cmd), f"(rc {out.returncode})\n", out.stdout, out.stderr)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    errors = [line["error"] for line in lines if "error" in line]
    if out.returncode != 0:
        return None, errors[0] if errors else f"rc {out.returncode}: {out.stderr[-400:]}"
    device = next((line for line in lines if "device" in line), {})
    return {line["case"]: line["seconds"] for line in lines if "case" in line}, device


def torch_init_seconds(device, nbytes, reps, cases):
    """torch.nn.init normal_(0, 0.02) / uniform_(-0.1, 0.1) on one tensor of
    nbytes per case; CUDA events on a GPU, the wall clock on the CPU."""
    import torch
    out = {}
    for dist, dtype in cases:
        dt = getattr(torch, dtype)
        t = torch.empty(nbytes // torch.empty((), dtype=dt).element_size(),
                        dtype=dt, device=device)
        t.zero_()
        if dist == "normal":
            def fn():
                torch.nn.init.normal_(t, 0.0, 0.02)
        else:
            def fn():
                torch.nn.init.uniform_(t, -0.1, 0.1)
        fn()
        seconds = []
        for _ in range(reps):
            if device == "cuda":
                start, stop = (torch.cuda.Event(enable_timing=True),
                               torch.cuda.Event(enable_timing=True))
                torch.cuda.synchronize()
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                seconds.append(start.elapsed_time(stop) / 1e3)
            else:
                start = time.perf_counter()
                fn()
                seconds.append(time.perf_counter() - start)
        out[f"{dist}/{dtype}"] = seconds
        del t
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def init_figures(nbytes, ours, theirs):
    """GB/s, ratios and goals from portable_cuda_bench's seconds (`ours`,
    with the cudaMemset and d2h_pinned baselines) and torch's (`theirs`)."""
    memset = gbps(nbytes, ours["cudaMemset"])
    figures = {"memset_gbps": round(memset, 1),
               "d2h_pinned_gbps": round(gbps(nbytes, ours["d2h_pinned"]), 2)}
    cases = {}
    for dist, dtype in INIT_CASES:
        name = f"{dist}/{dtype}"
        p = gbps(nbytes, ours[name])
        t = gbps(nbytes, theirs[name])
        cases[name] = {"portable_gbps": round(p, 1), "torch_gbps": round(t, 1),
                       "vs_memset": round(p / memset, 3),
                       "vs_torch": round(p / t, 2)}
    figures["cases"] = cases
    # The goals, per case: against memset, and against torch's call of the
    # same distribution and dtype.
    figures["goal_70pct_of_memset"] = "met" if all(
        c["vs_memset"] >= 0.7 for c in cases.values()) else "NOT met"
    figures["goal_ahead_of_torch"] = "met" if all(
        c["vs_torch"] > 1 for c in cases.values()) else "NOT met"
    return figures


def bench_init(ctx, figures):
    nbytes = (64 * MIB if ctx.quick else 2 * GIB if ctx.gpu else 256 * MIB)
    reps = 3 if ctx.quick else 10
    figures["bytes"] = nbytes
    figures["reps"] = reps
    ours, device = run_portable_cuda_bench(ctx, nbytes, reps, INIT_CASES)
    # Rehearsing, torch runs on the CPU (slowly: bfloat16 normal_ makes
    # about 10 MB/s on two cores), on a small tensor: only the code path
    # matters there, and no figure of it is a comparison.
    torch_bytes, torch_reps = (nbytes, reps) if ctx.gpu else (4 * MIB, 2)
    theirs = torch_init_seconds("cuda" if ctx.gpu else "cpu", torch_bytes,
                                torch_reps, INIT_CASES)
    figures["torch_device"] = "cuda" if ctx.gpu else "cpu"
    figures["torch_gbps"] = {k: round(gbps(torch_bytes, v), 2)
                             for k, v in theirs.items()}
    if ours is None:
        figures["portable_unavailable"] = device
        return (FAIL if ctx.gpu else SKIP), f"portable_cuda_bench: {device}"
    figures["device"] = device.get("device")
    figures.update(init_figures(nbytes, ours, theirs))
    return PASS, (f"goals: >= 70% of cudaMemset {figures['goal_70pct_of_memset']}, "
                  f"ahead of torch {figures['goal_ahead_of_torch']}")


# ---------------------------------------------------------------------------
# Materialize round trip vs in-process
# ---------------------------------------------------------------------------

def in_process_materialize(model_json, seed, device):
    """Seconds of: meta module, to_empty(device), per-tensor init with a
    generator of the device seeded like torch mode, synchronize."""
    import torch
    import matutil as m
    inits = m.resolve_inits(model_json)
    dtypes = m.TORCH_DTYPES
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    root = torch.nn.Module()
    params = {}
    for t in model_json["tensors"]:
        *path, leaf = t["name"].split(".")
        mod = root
        for part in path:
            child = getattr(mod, part, None) if part in mod._modules else None
            if child is None:
                child = torch.nn.Module()
                mod.add_module(part, child)
            mod = child
        if t.get("tieTo"):
            p = params[m.tie_root(model_json, t["name"])]
        else:
            p = torch.nn.Parameter(torch.empty(
                [int(s) for s in t.get("shape", [])], dtype=dtypes[t["dtype"]],
                device="meta"), requires_grad=False)
            params[t["name"]] = p
        mod.register_parameter(leaf, p)
    t1 = time.perf_counter()
    root.to_empty(device=device)
    sync()
    t2 = time.perf_counter()
    named = dict(root.named_parameters(remove_duplicate=False))
    init = torch.nn.init
    for t in model_json["tensors"]:
        if t.get("tieTo"):
            continue
        p = named[t["name"]].data
        scheme, params_ = inits[t["name"]]
        scheme = m.snake(scheme)
        if p.numel() == 0:
            continue
        g = torch.Generator(device=device).manual_seed(m.derive_seed(seed, t["name"]))
        if scheme == "zeros":
            init.zeros_(p)
        elif scheme == "ones":
            init.ones_(p)
        elif scheme == "constant":
            init.constant_(p, params_.get("val", 0.0))
        elif scheme == "normal":
            init.normal_(p, params_.get("mean", 0.0), params_.get("std", 1.0), generator=g)
        elif scheme == "uniform":
            init.uniform_(p, params_.get("a", 0.0), params_.get("b", 1.0), generator=g)
        elif scheme in ("arange", "rope_inv_freq", "eye"):  # computed buffers
            p.copy_(m.reference(list(p.shape), p.dtype, scheme, params_, seed,
                                t["name"]))
        else:
            raise ValueError(f"in-process baseline: no scheme {scheme}")
    sync()
    t3 = time.perf_counter()
    total = t3 - t0
    del root, params, named
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"meta": t1 - t0, "to_empty": t2 - t1, "init": t3 - t2, "total": total}


def bench_materialize(ctx, figures):
    import matutil as m
    name = ctx.data.get("llama_model") or "llama-1b"
    model_json = m.load_json(f"{name}.json")
    seed = int(model_json["model"].get("seed", 0))
    reps = 1 if ctx.quick else 3
    srv = ctx.server("a")
    device = ctx.devices["a_gpu"]
    figures["model"] = name
    figures["reps"] = reps

    def service(rng):
        req = dict(model_json)
        req["placement"] = {"device": device}
        msg = srv.parse_request(json.dumps(req))
        if rng:
            msg.model.rng = srv.pb.RNG_MODE_TORCH
        t0 = time.perf_counter()
        resp = srv.stub.Materialize(msg, metadata=srv.md(CLIENT), timeout=600)
        wall = time.perf_counter() - t0
        srv.release(resp.handle, CLIENT)
        if resp.device != device:
            raise RuntimeError(f"placed on {resp.device}, not {device}")
        return wall, resp.timings.total_us / 1e6, resp.timings.init_us / 1e6, \
            resp.tensor_bytes

    torch_device = "cuda" if ctx.gpu else "cpu"
    rows = {"service_portable": [], "service_torch": [], "in_process": []}
    server_phases = {"service_portable": [], "service_torch": []}
    phases = []
    for rep in range(reps + 1):  # the first is a warm-up
        for key, rng in (("service_portable", False), ("service_torch", True)):
            wall, total, init_s, nbytes = service(rng)
            if rep:
                rows[key].append(wall)
                server_phases[key].append((total, init_s))
        ip = in_process_materialize(model_json["model"], seed, torch_device)
        if rep:
            rows["in_process"].append(ip["total"])
            phases.append(ip)
    figures["bytes"] = nbytes
    figures["device"] = device
    baseline = median(rows["in_process"])
    figures["rows"] = {
        k: {"median_s": round(median(v), 4), "min_s": round(min(v), 4),
            "max_s": round(max(v), 4), "vs_in_process": round(median(v) / baseline, 3)}
        for k, v in rows.items()}
    for key, values in server_phases.items():
        figures["rows"][key]["server_total_s"] = round(median([x[0] for x in values]), 4)
        figures["rows"][key]["server_init_s"] = round(median([x[1] for x in values]), 4)
    figures["rows"]["in_process"]["phases_s"] = {
        k: round(median([p[k] for p in phases]), 4) for k in phases[0]}
    srv.assert_idle(CLIENT)
    ratio = figures["rows"]["service_portable"]["vs_in_process"]
    detail = (f"{name} on {device}: service (portable) / in-process = {ratio}")
    return (PASS if ctx.gpu else SKIP), detail if ctx.gpu else \
        f"rehearsal on the CPU ({detail}); the GPU figures need a GPU"


# ---------------------------------------------------------------------------
# Fetch throughput
# ---------------------------------------------------------------------------

def fetch_model(nbytes):
    per = nbytes // 16 // 4
    return {"model": {"tensors": [{"name": f"w.{i}", "shape": [per], "dtype": "float32"}
                                  for i in range(16)],
                      "initRules": [{"pattern": "*", "init": {"normal": {"std": 0.02}}}],
                      "seed": "7"}}


def fetch_discard(ctx, srv, handle):
    """(GB/s, digest) of one fetch by the C++ client, digest verified."""
    cmd = [str(ctx.bin / "fetch_discard"), f"--server={srv.address}",
           f"--handle={handle}", f"--client={CLIENT}"]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         timeout=max(5, ctx.left() - 5))
    line = out.stdout.strip()
    if out.returncode != 0 or "(verified)" not in line:
        raise RuntimeError(f"fetch_discard: rc {out.returncode}: {line} "
                           f"{out.stderr[-400:]}")
    parts = line.split()
    return float(parts[5]), parts[8]


def bench_fetch(ctx, figures):
    nbytes = 64 * MIB if ctx.quick else 4 * GIB if ctx.gpu else 512 * MIB
    reps = 1 if ctx.quick else 3
    a, b = ctx.server("a"), ctx.server("b")
    figures["bytes"] = nbytes
    results = {}
    for key, srv, device in (("cuda_arena", a, ctx.devices["a_gpu"]),
                             ("cpu_arena", b, ctx.devices["b_cpu"])):
        req = fetch_model(nbytes)
        req["placement"] = {"device": device}
        handle = srv.materialize(srv.parse_request(json.dumps(req)), CLIENT).handle
        try:
            cold, digest = fetch_discard(ctx, srv, handle)  # hashes as it streams
            warm = []
            for _ in range(reps):
                rate, again = fetch_discard(ctx, srv, handle)
                if again != digest:
                    raise RuntimeError(f"{key}: the digest changed between fetches")
                warm.append(rate)
        finally:
            srv.release(handle, CLIENT)
        results[key] = {"device": device, "cold_gbps": round(cold, 2),
                        "warm_gbps": round(median(warm), 2), "digest": digest}
    figures["sources"] = results
    same = results["cuda_arena"]["digest"] == results["cpu_arena"]["digest"]
    figures["same_digest"] = same
    figures["cuda_vs_cpu"] = round(results["cuda_arena"]["warm_gbps"] /
                                   results["cpu_arena"]["warm_gbps"], 2)
    copy, device = run_portable_cuda_bench(ctx, min(nbytes, GIB), 5, [])
    if copy is not None:
        figures["d2h_pinned_gbps"] = round(gbps(min(nbytes, GIB), copy["d2h_pinned"]), 2)
    else:
        figures["d2h_pinned_unavailable"] = device
    a.assert_idle(CLIENT)
    b.assert_idle(CLIENT)
    if not same:
        return FAIL, "the CUDA and the CPU arena's files have different digests"
    return (PASS if ctx.gpu else SKIP), (
        "digests verified and equal" if ctx.gpu else
        "rehearsal: both arenas on the CPU; the CUDA figures need a GPU")


BENCHES = {"bench_init": bench_init, "bench_materialize": bench_materialize,
           "bench_fetch": bench_fetch}


# ---------------------------------------------------------------------------
# Tables (gpu-run.md and RESULTS.md)
# ---------------------------------------------------------------------------

def markdown_for(check):
    """A Markdown table of a bench step's figures, or None."""
    f = check.get("figures") or {}
    name = check.get("name")
    if name == "bench_init" and f.get("cases"):
        lines = [
            f"{f['bytes'] / GIB:g} GiB buffer on {f.get('device')}, median of "
            f"{f['reps']} repetitions (CUDA events); 1 GB = 10^9 bytes. "
            f"cudaMemset: {f['memset_gbps']} GB/s; device-to-pinned-host copy: "
            f"{f['d2h_pinned_gbps']} GB/s.",
            "",
            "| case | portable GB/s | torch GB/s | portable / cudaMemset "
            "| portable / torch |",
            "|---|---:|---:|---:|---:|"]
        for case, c in f["cases"].items():
            lines.append(f"| {case} | {c['portable_gbps']} | {c['torch_gbps']} "
                         f"| {c['vs_memset']:.2f} | **{c['vs_torch']:.2f}x** |")
        lines += ["", f"Goals: >= 70% of cudaMemset: {f['goal_70pct_of_memset']}; "
                  f"ahead of torch's normal_/uniform_: {f['goal_ahead_of_torch']}."]
        return "\n".join(lines)
    if name == "bench_init" and f.get("torch_gbps"):
        return (f"torch on {f.get('torch_device')}: " +
                ", ".join(f"{k} {v} GB/s" for k, v in f["torch_gbps"].items()) +
                f"; portable CUDA: {f.get('portable_unavailable', 'n/a')}")
    if name == "bench_materialize" and f.get("rows"):
        lines = [
            f"{f['model']} ({f['bytes'] / 1e9:.2f} GB) on {f['device']}, median "
            f"of {f['reps']} repetitions after a warm-up (min-max), seconds; "
            "ratio = row / in-process (< 1: faster than in-process).",
            "",
            "| path | round trip | server total | server init | ratio |",
            "|---|---:|---:|---:|---:|"]
        titles = {"service_portable": "service, RNG_MODE_PORTABLE",
                  "service_torch": "service, RNG_MODE_TORCH",
                  "in_process": "in-process meta -> to_empty -> nn.init"}
        for key, r in f["rows"].items():
            lines.append(
                f"| {titles[key]} | {r['median_s']:.3f} ({r['min_s']:.3f}-"
                f"{r['max_s']:.3f}) | {r.get('server_total_s', '-')} "
                f"| {r.get('server_init_s', '-')} | **{r['vs_in_process']:.2f}** |")
        p = f["rows"]["in_process"].get("phases_s")
        if p:
            lines += ["", "In-process phases (median s): " +
                      ", ".join(f"{k} {v}" for k, v in p.items()) + "."]
        return "\n".join(lines)
    if name == "bench_fetch" and f.get("sources"):
        lines = [
            f"{f['bytes'] / GIB:g} GiB handle (16 float32 tensors), safetensors, "
            "bench/fetch_discard (C++ client, digest verified, bytes "
            "discarded); cold = first fetch (the server hashes as it streams), "
            "warm = median of the next ones.",
            "",
            "| arena | cold GB/s | warm GB/s |",
            "|---|---:|---:|"]
        for key, r in f["sources"].items():
            lines.append(f"| {key} ({r['device']}) | {r['cold_gbps']} | {r['warm_gbps']} |")
        lines += ["", f"CUDA / CPU arena (warm): {f['cuda_vs_cpu']}; "
                  f"device-to-pinned-host copy: {f.get('d2h_pinned_gbps', 'n/a')} GB/s; "
                  f"same file digest: {f['same_digest']}."]
        return "\n".join(lines)
    return None


def write_results(results_path):
    """The GPU section of bench/RESULTS.md from a GPU run's gpu-run.json."""
    sys.path.insert(0, HERE)
    import run as bench_run  # RESULTS.md writer
    data = json.loads(open(results_path, encoding="utf-8").read())
    if data.get("mode") != "gpu":
        raise SystemExit(f"{results_path} is from a {data.get('mode')} run, "
                         "not a GPU run: nothing to record")
    checks = {c["name"]: c for c in data["checks"]}
    env = checks.get("environment", {}).get("figures", {})
    gpu = env.get("gpu", "unknown GPU")
    body = [
        f"## GPU: {gpu} (tools/gpu-run)",
        "",
        f"- command: `./dev gpu-carry` here, then on the GPU machine "
        f"`{data['command']}`; recorded with `bench/gpu_bench.py --write gpu-run.json`",
        f"- date: {data['started']}",
        f"- machine: {gpu}, {env.get('gpu_mib', '?')} MiB, driver "
        f"{env.get('driver', '?')}, {env.get('cpus', '?')} CPUs",
        f"- software: torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
        f"Python {env.get('python')}, carry built at commit "
        f"{env.get('carry_commit')}, CUDA kernels: {env.get('cuda_kernels')}",
        f"- checks of the same run: {data['summary'].get('PASS', 0)} PASS, "
        f"{data['summary'].get('FAIL', 0)} FAIL, {data['summary'].get('SKIP', 0)} SKIP",
    ]
    titles = {"bench_init": "Portable init bandwidth on the GPU",
              "bench_materialize": "Materialize round trip on the GPU",
              "bench_fetch": "Fetch throughput from a CUDA arena"}
    for key, title in titles.items():
        table = markdown_for(checks.get(key, {}))
        body += ["", f"### {title}", "",
                 table or f"Not measured in this run ({checks.get(key, {}).get('status', 'absent')}: "
                          f"{checks.get(key, {}).get('detail', '')})."]
    bench_run.write_results("gpu", "\n".join(body), mark=MARK)
    print(f"updated {os.path.relpath(bench_run.RESULTS)}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="GPU_RUN_JSON", required=True,
                    help="a GPU run's gpu-run.json: replace the GPU section "
                    "of bench/RESULTS.md with its figures")
    args = ap.parse_args()
    write_results(args.write)


if __name__ == "__main__":
    main()
