#!/usr/bin/env python3
"""Checkpoint loads: time until the trainer's module holds pretrained weights
it can train (resident, writable, in the training dtype).

The benchmark writes a llama-1b-shaped checkpoint once (the llama-1b
example's shapes as a LlamaForCausalLM, TinyLlama-1.1B: 1.1 B parameters,
bfloat16, 2.2 GB, `save_pretrained` with max_shard_size 1GB: 3 shards and
model.safetensors.index.json), under a folder the server reads as the
checkpoint root "bench". Then one run alternates N timed repetitions (after
a warm-up; each repetition in its own shuffled order) of

  hf bf16      transformers' from_pretrained(folder, dtype=bfloat16): maps
               the files and returns;
  sdk bf16     the model built on the meta device from the config
               (bfloat16), then materializer.materialize(model,
               checkpoint="bench/llama-1b"): the server reads the files into
               shared memory and the module's tensors become views of it;
  hf fp32      from_pretrained(folder, dtype=float32): fp32 master weights
               from the bf16 checkpoint, cast in this process;
  sdk fp32     the model built in float32 on meta, the same materialize():
               the server casts while it reads;

each followed by the first write of every weight (x *= 1 over all
parameters, what the first optimizer step does to memory), and reported
with it. With the page cache warm (the files were just written or read):
the time is the loaders' own work, not the disk's.

"sdk bf16, pool" and "sdk fp32, pool" are the same against a server with
the default adaptive pool (--pool, --shm_pool_bytes; "auto" by default, 0
for none) started for each of these measurements (bench/run.py's
pooled_service: warmed up by one whole load into a handle that is not
exportable, which leaves its checkpoint cache as a load leaves a
long-running server's, then by one load of the same model over shm, which
teaches the adaptive pool its size as a node's first job would; then its
pool full), whose arena comes from shared memory it made resident before
the call; it is stopped right after, so no other path runs while it holds
that memory. "sdk bf16" and "sdk fp32" use the long-running server
without a pool (--shm_pool_bytes=0): fresh pages, what the first load of
a server's life gets ("sdk, fresh pages" in the tables).
With --ranks, the ranks time "sdk Shard(0), pool" too.

--model moe-1b times a Mixtral-shaped checkpoint of about the same size
instead (moe_1b below): save_pretrained stores every expert's weights as
tensors of their own, which from_pretrained stacks and concatenates in the
trainer's process, and which the server assembles (CheckpointSource.
assemblies) while it reads.

--huge-pages (as root) adds "sdk bf16, huge pages" and "sdk fp32, huge
pages": a second long-running server whose --shm_dir is a tmpfs this
benchmark mounts with huge=within_size (unmounted at the end), so that
the trainer's weights arrive in fresh 2 MiB pages instead of 4 KiB ones;
with a pool, "... pool, huge pages" rows too (a pooled server with that
--shm_dir); with --ranks, the same two for "sdk Shard(0)".

--ranks N adds N ranks on this host (gloo, bench/checkpoint_ranks.py; with
--ranks-only, only they run, and their tables are printed):
each rank's from_pretrained then its Shard(0) rows, against the SDK
materializing only each rank's rows; wall time and peak RSS per rank.

--stream adds the trainer that cannot read the files (they exist only
under the server's root): the stream transport's GB/s into the module,
next to a raw TCP stream of the same bytes over loopback in the same
repetition (bench/sdk.py's raw_tcp).

--cold adds (as root) the caches-dropped case: before each of its
repetitions `echo 3 > /proc/sys/vm/drop_caches`, then the server's load
(sdk bf16) next to one sequential O_DIRECT read of the same files
(`dd iflag=direct bs=16M`), the best a single reader gets from the disk.

    .venv/bin/python bench/checkpoint.py            # print the tables
    .venv/bin/python bench/checkpoint.py --write    # ... and update bench/RESULTS.md
"""

import argparse
import datetime
import gc
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import run as bench_run  # noqa: E402  (Service, machine, git_commit, write_results)
from sdk import raw_tcp, write_once  # noqa: E402  (the trainer SDK bench's own)

NAME = "llama-1b"      # --model
CLASS = "LlamaForCausalLM"
PATHS = ("hf bf16", "sdk bf16", "hf fp32", "sdk fp32")


def llama_1b():
    import transformers
    return transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
        max_position_embeddings=2048, tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"])


def moe_1b():
    """A Mixtral shape of about the same size (1.1 B parameters, 8 experts
    of which 2 are active): save_pretrained stores each expert's w1, w2 and
    w3 as tensors of their own (1,344 of them), which from_pretrained
    stacks and concatenates into the module's fused experts, and which the
    server assembles."""
    import transformers
    return transformers.MixtralConfig(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=14,
        num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
        num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=2048,
        tie_word_embeddings=False, architectures=["MixtralForCausalLM"])


MODELS = {"llama-1b": ("LlamaForCausalLM", llama_1b),
          "moe-1b": ("MixtralForCausalLM", moe_1b)}


def config():
    return MODELS[NAME][1]()


def write_checkpoint(folder):
    """save_pretrained of a bfloat16 llama-1b with made-up values (uniform,
    drawn in float32 and rounded), unless the folder already holds it."""
    import transformers
    done = os.path.join(folder, ".complete")
    if os.path.exists(done):
        return
    os.makedirs(folder, exist_ok=True)
    with torch.device("meta"):
        model = getattr(transformers, CLASS)(config()).to(torch.bfloat16)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.empty(p.shape).uniform_(-0.05, 0.05, generator=g))
    model.save_pretrained(folder, max_shard_size="1GB", safe_serialization=True)
    open(done, "w").close()


def files_of(folder):
    return sorted(glob.glob(os.path.join(folder, "*.safetensors")))


def hf_load(folder, dtype):
    import transformers
    t0 = time.perf_counter()
    model = getattr(transformers, CLASS).from_pretrained(folder, dtype=dtype)
    return model, time.perf_counter() - t0, {}


def sdk_load(client, dtype):
    import materializer
    from materializer import hf
    t0 = time.perf_counter()
    model = hf.from_config(config(), CLASS, dtype=dtype)
    r = materializer.materialize(model, client=client, checkpoint=f"bench/{NAME}",
                                 progress=False)
    wall = time.perf_counter() - t0
    report = r.checkpoint
    # Every parameter from the file (the rotary buffers are computed).
    assert report.tensors_loaded == sum(1 for _ in model.parameters()), report
    phases = dict(r.seconds)
    phases["read_from_files"] = report.bytes_read_from_files
    return model, wall, phases


def sdk_stream(client):
    """The stream transport (what a trainer without /dev/shm access to the
    server, or on another host, gets): seconds of the whole call and of its
    load phase (the bytes crossing loopback into the module)."""
    import materializer
    from materializer import hf
    model = hf.from_config(config(), CLASS, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    r = materializer.materialize(model, client=client, checkpoint=f"bench/{NAME}",
                                 transport="stream", progress=False)
    wall = time.perf_counter() - t0
    return wall, r.seconds["load"]


def warm_up_load(client):
    """One whole load of the checkpoint into a handle that is not
    exportable (stream transport, one handle): a fresh server's checkpoint
    cache is then where a long-running server's is after a load (the same
    reads in the same order), and its shared-memory pool is untouched."""
    import materializer
    from materializer import hf
    model = hf.from_config(config(), CLASS, dtype=torch.bfloat16)
    materializer.materialize(model, client=client, checkpoint=f"bench/{NAME}",
                             transport="stream", part_bytes=0, progress=False)


def shmem_huge_bytes():
    """Shared memory held in 2 MiB pages now (ShmemHugePages)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("ShmemHugePages:"):
                return int(line.split()[1]) * 1024
    return 0


def run_ranks(world, address, folder, reps, pool_server=None, huge_address=None):
    """bench/checkpoint_ranks.py on `world` processes; rank 0's records."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = os.path.join(tempfile.mkdtemp(prefix="ckpt-ranks-"), "records.jsonl")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "checkpoint_ranks.py"),
                               str(r), str(world), port, address, folder,
                               f"bench/{NAME}", str(reps), out]
                              + [pool_server or "null", huge_address or ""])
             for r in range(world)]
    for rank, p in enumerate(procs):
        if p.wait(timeout=3600) != 0:
            raise SystemExit(f"rank {rank} exited with {p.returncode}")
    with open(out, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def ranks_table(ranks, world):
    """Markdown lines for run_ranks' records: wall and peak against hf, then
    the phases."""
    by = {p: [r for r in ranks if r["path"] == p]
          for p in ("hf + shard", "sdk Shard(0)", "sdk Shard(0), pool",
                    "sdk Shard(0), huge pages", "sdk Shard(0), pool, huge pages")}
    by = {p: rs for p, rs in by.items() if rs}
    base_wall = med([r["wall"] for r in by["hf + shard"]])
    base_peak = med([max(r["peaks"]) for r in by["hf + shard"]])
    lines = ["", f"{world} ranks on this host (gloo), bfloat16, Shard(0) "
              "rows of every parameter: from the first barrier to the last, each "
              "rank's weights written once; peak = the largest rank's RSS growth.", "",
              "| path | wall | ratio to hf | peak RSS per rank | ratio to hf | "
              "bytes per rank |", "|---|---:|---:|---:|---:|---:|"]
    for p, rs in by.items():
        wall = med([r["wall"] for r in rs])
        peak = med([max(r["peaks"]) for r in rs])
        lines.append(f"| {p} | {span([r['wall'] for r in rs])} | "
                     f"**{wall / base_wall:.2f}** | {peak / 1e9:.2f} GB | "
                     f"**{peak / base_peak:.2f}** | {rs[0]['local_bytes'] / 1e9:.2f} GB |")
    lines += ["", "Where a rank's time goes: for each phase, the median over repetitions "
              "of the slowest rank's seconds (the wait is at the last barrier, for "
              "the slowest rank).", "",
              "| path | phases, seconds |", "|---|---|"]
    for p, rs in by.items():
        names = list(rs[0]["phases"][0])
        cells = ", ".join(
            f"{n} {med([max(ph[n] for ph in r['phases']) for r in rs]):.3f}"
            for n in names)
        lines.append(f"| {p} | {cells} |")
    return lines


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def direct_read(files):
    """Seconds for one sequential O_DIRECT read of every file (dd)."""
    t0 = time.perf_counter()
    for path in files:
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def med(xs):
    return statistics.median(xs)


def span(xs):
    return f"{bench_run.ms(med(xs))} ({bench_run.ms(min(xs))}–{bench_run.ms(max(xs))})"


def main():
    global NAME, CLASS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(),
                                                  "materializer-bench-checkpoint"),
                    help="the checkpoint root (the checkpoint is written once and kept)")
    ap.add_argument("--cold", action="store_true",
                    help="also the caches-dropped case (needs root)")
    ap.add_argument("--ranks", type=int, default=0,
                    help="also N ranks on this host, Shard(0) (0: not run)")
    ap.add_argument("--ranks-only", action="store_true",
                    help="with --ranks: only the ranks, printed (not written)")
    ap.add_argument("--stream", action="store_true",
                    help="also the stream transport against raw loopback TCP")
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--pool", default="auto",
                    help="--shm_pool_bytes of a second server, timed as '... pool' "
                         "(default: the server's default, auto; 0: none)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="as root: also time a server whose --shm_dir is a huge-page tmpfs")
    ap.add_argument("--model", choices=sorted(MODELS), default=NAME,
                    help="llama-1b (dense) or moe-1b (Mixtral-shaped, experts stored one "
                         "by one)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    NAME, CLASS = args.model, MODELS[args.model][0]
    if args.ranks and NAME != "llama-1b":
        ap.error("--ranks times llama-1b only")
    os.environ["MATERIALIZER_PY_PROTO"] = args.proto
    command = " ".join([".venv/bin/python", "bench/checkpoint.py"]
                       + bench_run.shown_args(sys.argv[1:]))
    torch.set_num_threads(args.threads)
    import transformers
    transformers.utils.logging.disable_progress_bar()
    mach = bench_run.machine()
    folder = os.path.join(args.dir, NAME)
    write_checkpoint(folder)
    files = files_of(folder)
    nbytes = sum(os.path.getsize(f) for f in files)
    print(f"# {mach['cpu']}, {mach['cores']} cores; checkpoint {folder}: {len(files)} files, "
          f"{nbytes / 1e9:.2f} GB", file=sys.stderr)

    import materializer
    load_before = os.getloadavg()[0]
    svc = bench_run.Service(args.server, args.proto, args.threads,
                            extra_args=[f"--checkpoint_roots=bench={args.dir}"])
    client = materializer.Client(svc.address)
    huge_dir = huge_svc = huge_client = None
    if args.huge_pages:
        huge_dir = bench_run.mount_huge_tmpfs()
        huge_svc = bench_run.Service(args.server, args.proto, args.threads,
                                     extra_args=[f"--checkpoint_roots=bench={args.dir}",
                                                 f"--shm_dir={huge_dir}"])
        huge_client = materializer.Client(huge_svc.address)
    huge_address = huge_svc.address if huge_svc else None
    pooled = args.pool != "0"
    pool_server = json.dumps({"server": args.server, "proto": args.proto,
                              "threads": args.threads, "pool": args.pool,
                              "root": f"bench={args.dir}",
                              "huge_shm_dir": huge_dir}) if pooled else None
    if args.ranks_only:
        try:
            ranks = run_ranks(args.ranks, svc.address, folder, args.reps, pool_server,
                              huge_address)
            client.close()
        finally:
            svc.stop()
            if huge_svc:
                huge_client.close()
                huge_svc.stop()
                bench_run.unmount(huge_dir)
        print("\n".join(ranks_table(ranks, args.ranks)))
        return
    paths = (list(PATHS) + (["sdk bf16, pool", "sdk fp32, pool"] if pooled else [])
             + (["sdk bf16, huge pages", "sdk fp32, huge pages"] if huge_svc else [])
             + (["sdk bf16, pool, huge pages", "sdk fp32, pool, huge pages"]
                if huge_svc and pooled else []))

    def warm_up_pooled(client, dtype):
        warm_up_load(client)
        if args.pool == "auto":
            # The adaptive pool learns its size from a load over shm.
            model, _, _ = sdk_load(client, dtype)
            del model
            gc.collect()

    def pooled_load(dtype, shm_dir=None):
        with bench_run.pooled_service(
                args.server, args.proto, args.threads, args.pool,
                extra_args=[f"--checkpoint_roots=bench={args.dir}"]
                + ([f"--shm_dir={shm_dir}"] if shm_dir else []),
                warm_up=lambda c: warm_up_pooled(c, dtype)) as psvc:
            pooled_client = materializer.Client(psvc.address)
            model, wall, ph = sdk_load(pooled_client, dtype)
            write = write_once(model)
            pooled_client.close()
            del model
            gc.collect()
        return wall, write, ph

    times = {p: [] for p in paths}
    writes = {p: [] for p in paths}
    phases = {p: [] for p in paths}
    cold = {"sdk": [], "dd": [], "read": []}
    stream = {"call": [], "load": [], "tcp": []}
    ranks = []
    try:
        for i in range(args.warmup + args.reps):
            timed = i >= args.warmup
            order = list(paths)
            random.Random(i).shuffle(order)
            for p in order:
                gc.collect()
                dtype = torch.bfloat16 if "bf16" in p else torch.float32
                if ", pool" in p:
                    wall, write, ph = pooled_load(
                        dtype, huge_dir if p.endswith("huge pages") else None)
                else:
                    if p.startswith("hf"):
                        model, wall, ph = hf_load(folder, dtype)
                    else:
                        model, wall, ph = sdk_load(
                            huge_client if p.endswith("huge pages") else client, dtype)
                        # How much of the module came in 2 MiB pages (the
                        # kernel gives 4 KiB ones when it has no free 2 MiB).
                        ph["huge_bytes"] = shmem_huge_bytes()
                    write = write_once(model)
                    assert all(t.dtype == dtype for t in model.parameters())
                    del model
                    gc.collect()
                print(f"{'rep' if timed else 'warm-up'} {i + 1}: {p} {wall:.3f} s "
                      f"+ first write {write:.3f} s {ph}", file=sys.stderr)
                if timed:
                    times[p].append(wall)
                    writes[p].append(write)
                    phases[p].append(ph)
            if args.stream and timed:
                for what in random.Random(2000 + i).sample(["stream", "tcp"], 2):
                    gc.collect()
                    if what == "tcp":
                        stream["tcp"].append(raw_tcp(nbytes))
                    else:
                        call, load = sdk_stream(client)
                        stream["call"].append(call)
                        stream["load"].append(load)
                    gc.collect()
            if args.cold and timed:
                for what in random.Random(1000 + i).sample(["sdk", "dd"], 2):
                    drop_caches()
                    if what == "dd":
                        cold["dd"].append(direct_read(files))
                    else:
                        model, wall, ph = sdk_load(client, torch.bfloat16)
                        cold["sdk"].append(wall)
                        cold["read"].append(ph["materialize"])
                        del model
                        gc.collect()
                    print(f"cold rep {i + 1}: {what} {cold[what][-1]:.3f} s", file=sys.stderr)
        if args.ranks:
            ranks = run_ranks(args.ranks, svc.address, folder, args.reps, pool_server,
                              huge_address)
        client.close()
        svc.check_idle()
        if huge_svc:
            huge_client.close()
            huge_svc.check_idle()
    finally:
        svc.stop()
        if huge_svc:
            huge_svc.stop()
            bench_run.unmount(huge_dir)
    load_after = os.getloadavg()[0]

    ready = {p: [t + w for t, w in zip(times[p], writes[p])] for p in paths}
    lines = [
        f"Checkpoint: {NAME}, bfloat16, {len(files)} safetensors shards, "
        f"{nbytes / 1e9:.2f} GB, page cache warm. Median of {args.reps} interleaved "
        "repetitions (min–max), milliseconds. Ready to train = the call, then the first "
        "write of every weight; ratio = hf / sdk for the same dtype (> 1: the SDK is "
        "faster).",
        "",
        "| dtype | path | call | first write | ready to train | hf / sdk |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for dt in ("bf16", "fp32"):
        base = med(ready[f"hf {dt}"])
        for p in ((f"hf {dt}", f"sdk {dt}") + ((f"sdk {dt}, pool",) if pooled else ())
                  + ((f"sdk {dt}, huge pages",) if huge_svc else ())
                  + ((f"sdk {dt}, pool, huge pages",) if huge_svc and pooled else ())):
            label = ("sdk, " + p.split(", ", 1)[1] if ", " in p
                     else "sdk, fresh pages" if p.startswith("sdk") else p.split()[0])
            label = label.replace("sdk, huge pages", "sdk, fresh huge pages")
            lines.append(f"| {dt} | {label} | {span(times[p])} | "
                         f"{bench_run.ms(med(writes[p]))} | {span(ready[p])} | "
                         f"**{base / med(ready[p]):.2f}** |")
    if huge_svc:
        lines += ["", "Shared memory in 2 MiB pages right after each 'huge pages' load "
                  "(ShmemHugePages, the module alive; median, min-max): " + "; ".join(
                      f"{dt} {med([ph['huge_bytes'] for ph in phases[f'sdk {dt}, huge pages']]) / 1e9:.2f} GB "
                      f"({min(ph['huge_bytes'] for ph in phases[f'sdk {dt}, huge pages']) / 1e9:.2f}-"
                      f"{max(ph['huge_bytes'] for ph in phases[f'sdk {dt}, huge pages']) / 1e9:.2f})"
                      for dt in ("bf16", "fp32")) + "."]
    sdk_phases = [ph for ph in phases["sdk bf16"]]
    lines += ["", "SDK phases (bf16, medians, ms): " + ", ".join(
        f"{k} {bench_run.ms(med([ph[k] for ph in sdk_phases]))}"
        for k in ("describe", "materialize", "load")) + "; bytes read from files per "
        f"load: {med([ph['read_from_files'] for ph in sdk_phases]) / 1e9:.2f} GB."]
    if stream["call"]:
        tcp_bw = nbytes / med(stream["tcp"])
        load_bw = nbytes / med(stream["load"])
        lines += ["", "A trainer without access to the files: the stream transport "
                  "(materialize(..., transport=\"stream\")), the load phase being the "
                  "checkpoint's bytes crossing loopback into the module (XXH3-checked), "
                  "against a raw TCP stream of the same bytes in the same repetition.", "",
                  "| case | seconds | GB/s | ratio to raw TCP |", "|---|---:|---:|---:|",
                  f"| raw TCP (sendall / recv_into) | {span(stream['tcp'])} | "
                  f"{tcp_bw / 1e9:.2f} | **1.00** |",
                  f"| sdk stream: load phase | {span(stream['load'])} | {load_bw / 1e9:.2f} | "
                  f"**{load_bw / tcp_bw:.2f}** |",
                  f"| sdk stream: whole call | {span(stream['call'])} | "
                  f"{nbytes / med(stream['call']) / 1e9:.2f} | "
                  f"**{nbytes / med(stream['call']) / tcp_bw:.2f}** |"]
    if ranks:
        lines += ranks_table(ranks, args.ranks)
    if cold["sdk"]:
        sdk_bw = nbytes / med(cold["read"])
        dd_bw = nbytes / med(cold["dd"])
        lines += ["", "Caches dropped before each repetition (as root): the server's "
                  "Materialize (read from the disk into shared memory) against one "
                  "sequential O_DIRECT read of the same files (dd, bs=16M).", "",
                  "| case | seconds | GB/s | ratio to dd |", "|---|---:|---:|---:|",
                  f"| dd iflag=direct | {span(cold['dd'])} | {dd_bw / 1e9:.2f} | **1.00** |",
                  f"| sdk bf16: Materialize | {span(cold['read'])} | {sdk_bw / 1e9:.2f} | "
                  f"**{sdk_bw / dd_bw:.2f}** |",
                  f"| sdk bf16: whole call | {span(cold['sdk'])} | "
                  f"{nbytes / med(cold['sdk']) / 1e9:.2f} | "
                  f"**{nbytes / med(cold['sdk']) / dd_bw:.2f}** |"]
    table = "\n".join(lines)
    print(table)
    if args.write:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        model_key = "" if NAME == "llama-1b" else f" {NAME}"
        key = re.sub(r"[^a-z0-9]+", "-",
                     f"checkpoint{model_key} {mach['cpu']} {mach['cores']}c".lower())
        body = "\n".join([
            f"## Checkpoint loads{model_key}: {mach['cpu']}, {mach['cores']} cores, {mach['ram']}",
            "",
            f"- command: `{command}`",
            f"- date: {date}",
            f"- software: torch {torch.__version__}, commit {bench_run.git_commit()}; "
            f"{args.threads} threads on both sides",
            f"- 1-minute load average {load_before:.2f} before, {load_after:.2f} after",
            *([f"- 'pool' rows: a server started for each of their measurements with "
               f"`--shm_pool_bytes={args.pool}`"
               + (" (the default)" if args.pool == "auto" else "")
               + " (warmed up by one load into a handle that is not exportable"
               + (" and one over shm, which teaches the adaptive pool its size"
                  if args.pool == "auto" else "")
               + ", its pool full), stopped after; 'fresh pages' rows: the long-running "
               "server without a pool (`--shm_pool_bytes=0`)"] if pooled else []),
            *(["- 'huge pages' rows: a second long-running server with `--shm_dir` on a "
               "tmpfs mounted `huge=within_size` (fresh 2 MiB pages); 'pool, huge pages': "
               "the pooled server with that `--shm_dir`"] if huge_svc else []),
            "",
            table,
        ])
        bench_run.write_results(key.strip("-"), body, mark="bench/checkpoint.py")


if __name__ == "__main__":
    main()
