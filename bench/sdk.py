#!/usr/bin/env python3
"""Trainer SDK: time until the trainer's module holds initialized weights.

For each model (Hugging Face GPT-2 small, and the llama-1b example's
shapes as a LlamaForCausalLM: TinyLlama-1.1B, float32), built on the meta
device before the clock starts, one run alternates N timed repetitions
(after a warm-up; each repetition in its own shuffled order) of

every path followed by the first write of every weight (what the first
optimizer step does to memory), timed apart and reported with the path:

  in-process   model.to_empty(device="cpu"), then the model's own init
               (Hugging Face's init_weights(): every _init_weights, then the
               ties), in this process;
  shm, pool    materializer.materialize(model, transport="shm"), what
               transport="auto" picks for a co-located CPU trainer: describe,
               Materialize on the server, ExportHandle, the module's tensors
               become views of the shared memory, Release; against a server
               with the default adaptive pool (--shm_pool_bytes=auto; --pool)
               started for this measurement and warmed by one load of the
               same model, which teaches the pool that size, as on any
               server after its first export (bench/run.py's
               pooled_service): the arena is built from shared memory the
               server made resident before the call. It is stopped right
               after, so no other path runs while it holds that memory;
  shm, fresh pages  the same against the long-running server without a
               pool (--shm_pool_bytes=0): fresh pages, what the first
               export of a server's life gets;
  shm, fresh huge pages  (--huge-pages, as root) the same against a second
               server without a pool whose --shm_dir is a tmpfs mounted
               huge=within_size (fresh 2 MiB pages; docs/operations.md);
               and "shm, pool, huge pages" (the pooled server with that
               --shm_dir);
  stream       materializer.materialize(model, transport="stream"): the same
               with the weights streamed into the module's tensors (raw
               format, received straight into place by client/direct.py,
               XXH3 checked); a model larger than the SDK's part_bytes
               (512 MiB: llama-1b) in parts, the next part materialized
               while the last one streams (docs/python.md, "Parts");
  stream, one handle  (models of several parts) the same with
               part_bytes=0: one Materialize of the whole model, then one
               stream, as before parts;
  stream x2    one handle over two parallel streams (two connections);
  stream grpcio  one handle received through grpcio's messages
               (Client(direct_fetch=False)) instead of straight into the
               tensors (client/direct.py);
  new user     (GPT-2 only) what a trainer without the SDK does: Materialize a
               request, FetchWeights into memory with grpcio, safetensors.torch
               .load, load_state_dict(assign=True);

and, in every repetition, a raw TCP stream over loopback of the same number
of bytes into a preallocated buffer (sendall / recv_into), the ceiling of
loopback, and grpcio receiving the same FetchWeights stream and dropping it
(no copy, no hash), the ceiling of a grpcio client.
The service paths use the service's default RNG mode (portable; --rng torch
for torch mode); the in-process path draws with torch's generator. Both
sides use the same thread count (torch.set_num_threads here;
OMP_NUM_THREADS, MKL_NUM_THREADS and --workers for the server).

    .venv/bin/python bench/sdk.py            # print the tables
    .venv/bin/python bench/sdk.py --write    # ... and update bench/RESULTS.md
"""

import argparse
import datetime
import gc
import os
import platform
import random
import re
import socket
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import run as bench_run  # noqa: E402  (Service, machine, git_commit, write_results)

MODELS = ("gpt2-small", "llama-1b")


def build(model_name):
    import transformers
    from materializer import hf
    if model_name == "gpt2-small":
        config = transformers.GPT2Config()
        auto = "AutoModelForCausalLM"
    else:
        config = transformers.LlamaConfig(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
            max_position_embeddings=2048, tie_word_embeddings=False)
        auto = "AutoModelForCausalLM"
    return hf.from_config(config, auto)


def rss_peak_reset():
    """Resets this process's peak RSS (VmHWM) and returns the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status("VmRSS")


def _status(key):
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def write_once(model):
    """What the trainer's first optimizer step does to memory: write every
    weight once (x *= 1, every element; the values stay)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        torch._foreach_mul_([p for p in model.parameters()], 1.0)
    return time.perf_counter() - t0


def in_process(model):
    t0 = time.perf_counter()
    model.to_empty(device="cpu")
    model.init_weights()
    return time.perf_counter() - t0, {}


def warm_up(name, client, rng):
    """One shm load of model `name`, its module dropped: what a server's
    adaptive pool learns its size from (the first export of a size)."""
    import materializer
    model = build(name)
    materializer.materialize(model, client=client, transport="shm", rng=rng,
                             progress=False)
    del model
    gc.collect()


def service(model, client, transport, rng, seed, streams=1, part_bytes=None):
    import materializer
    if part_bytes is None:
        part_bytes = materializer.api.PART_BYTES
    t0 = time.perf_counter()
    r = materializer.materialize(model, client=client, transport=transport, rng=rng,
                                 seed=seed, progress=False, streams=streams,
                                 part_bytes=part_bytes)
    wall = time.perf_counter() - t0
    assert r.transport == transport, r.transport
    return wall, dict(r.seconds)


def new_user(model, client, rng, seed):
    """Materialize + FetchWeights (safetensors, into memory, grpcio's own
    message parsing) + safetensors.torch.load + load_state_dict(assign)."""
    import materializer
    import safetensors.torch
    from materializer._proto import pb
    from materializer.v1 import materializer_pb2_grpc as pb_grpc
    spec = materializer.describe(model, seed=seed, rng=rng)   # the hand-written JSON
    t0 = time.perf_counter()
    stub = pb_grpc.MaterializerStub(client._conn.channel(client.address))
    resp = stub.Materialize(pb.MaterializeRequest(model=spec.to_proto()), timeout=3600)
    parts = [c.data for c in stub.FetchWeights(pb.FetchRequest(handle=resp.handle), timeout=3600)]
    blob = b"".join(parts)
    del parts
    state = safetensors.torch.load(blob)
    del blob
    model.load_state_dict(state, strict=False, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    wall = time.perf_counter() - t0
    stub.Release(pb.ReleaseRequest(handle=resp.handle), timeout=600)
    return wall, {}


def raw_tcp(nbytes, chunk=4 << 20):
    """Seconds to stream nbytes over loopback into a preallocated buffer."""
    src = bytearray(min(nbytes, 64 << 20))
    dst = bytearray(nbytes)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def send():
        s, _ = listener.accept()
        left = nbytes
        mv = memoryview(src)
        while left:
            n = min(left, len(src))
            s.sendall(mv[:n])
            left -= n
        s.close()

    th = threading.Thread(target=send)
    th.start()
    c = socket.create_connection(listener.getsockname())
    view = memoryview(dst)
    got = 0
    t0 = time.perf_counter()
    while got < nbytes:
        n = c.recv_into(view[got:got + chunk])
        if not n:
            break
        got += n
    wall = time.perf_counter() - t0
    th.join()
    c.close()
    listener.close()
    assert got == nbytes
    return wall


def grpc_receive(model, client, rng, seed):
    """Seconds to receive the stream path's bytes with grpcio and drop them:
    Materialize (not timed), then one FetchWeights of the same raw layout,
    each chunk parsed without copying its data and not used; no copy into
    tensors, no hash. The ceiling of any grpcio client of this stream."""
    import materializer
    from materializer.load import fetch_fields
    spec = materializer.describe(model, seed=seed, rng=rng)
    handle = client.materialize(spec.to_proto()).handle
    try:
        t0 = time.perf_counter()
        got = sum(len(c.data) for c in client.fetch(handle, **fetch_fields(spec)))
        wall = time.perf_counter() - t0
    finally:
        client.release(handle)
    return wall, got


def fmt_ms(s):
    return bench_run.ms(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rng", default="portable", choices=["portable", "torch"],
                    help="RNG mode of the service paths (default: the service's default)")
    ap.add_argument("--new-user", default="gpt2-small",
                    help="models to also time the path without the SDK for (comma list)")
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--pool", default="auto",
                    help="--shm_pool_bytes of the 'shm, pool' server (default: the "
                         "server's default, auto; 0: no such path)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="as root: also time servers whose --shm_dir is a huge-page tmpfs")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    models = args.models.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        ap.error(f"unknown model(s): {', '.join(sorted(unknown))}")
    os.environ["MATERIALIZER_PY_PROTO"] = args.proto
    command = " ".join([".venv/bin/python", "bench/sdk.py"] + bench_run.shown_args(sys.argv[1:]))
    torch.set_num_threads(args.threads)
    mach = bench_run.machine()
    print(f"# {mach['cpu']}, {mach['cores']} cores, {mach['ram']}; torch {torch.__version__}, "
          f"{args.threads} threads on both sides", file=sys.stderr)

    import materializer
    load_before = os.getloadavg()[0]
    svc = bench_run.Service(args.server, args.proto, args.threads)
    client = materializer.Client(svc.address)
    grpcio_client = materializer.Client(svc.address, direct_fetch=False)
    huge_dir = huge_svc = huge_client = None
    if args.huge_pages:
        huge_dir = bench_run.mount_huge_tmpfs()
        huge_svc = bench_run.Service(args.server, args.proto, args.threads,
                                     extra_args=[f"--shm_dir={huge_dir}"])
        huge_client = materializer.Client(huge_svc.address)
    pooled = args.pool != "0"
    results = []
    try:
        for name in models:
            rng = args.rng
            nbytes = materializer.describe(build(name), rng=rng).nbytes
            parted = nbytes > materializer.api.PART_BYTES
            paths = (["in-process"] + (["shm, pool"] if pooled else []) + ["shm, fresh pages"]
                     + (["shm, fresh huge pages"] if huge_svc else [])
                     + (["shm, pool, huge pages"] if huge_svc and pooled else []) + ["stream"]
                     + (["stream, one handle"] if parted else [])
                     + ["stream x2", "stream grpcio"]
                     + (["new user"] if name in args.new_user.split(",") else []))
            times = {p: [] for p in paths}
            writes = {p: [] for p in paths}
            phases = {p: [] for p in paths}
            peaks = {p: [] for p in paths}
            tcp = []
            grpc_only = []   # bytes/s
            for i in range(args.warmup + args.reps):
                timed = i >= args.warmup
                # Each repetition runs the paths in its own order (shuffled,
                # seeded by the repetition): a path right after another pays
                # for the memory that one just returned (the server's and
                # this process's pages are new again), so no path always
                # follows the same one.
                order = list(paths)
                random.Random(i).shuffle(order)
                for p in order:
                    model = build(name)
                    gc.collect()
                    pool_block = None
                    if p.startswith("shm, pool"):
                        pool_block = bench_run.pooled_service(
                            args.server, args.proto, args.threads, args.pool,
                            extra_args=[f"--shm_dir={huge_dir}"] if p.endswith("huge pages")
                            else (),
                            warm_up=lambda c, name=name: warm_up(name, c, rng))
                        pooled_client = materializer.Client(pool_block.__enter__().address)
                    base = rss_peak_reset()
                    if p == "in-process":
                        wall, ph = in_process(model)
                    elif p == "new user":
                        wall, ph = new_user(model, client, rng, 0)
                    elif p == "stream grpcio":
                        wall, ph = service(model, grpcio_client, "stream", rng, 0, part_bytes=0)
                    elif p == "stream x2":
                        wall, ph = service(model, client, "stream", rng, 0, streams=2,
                                           part_bytes=0)
                    elif p.startswith("shm, pool"):
                        wall, ph = service(model, pooled_client, "shm", rng, 0)
                        pooled_client.close()
                    elif p == "shm, fresh huge pages":
                        wall, ph = service(model, huge_client, "shm", rng, 0)
                    elif p == "shm, fresh pages":
                        wall, ph = service(model, client, "shm", rng, 0)
                    elif p == "stream, one handle":
                        wall, ph = service(model, client, "stream", rng, 0, part_bytes=0)
                    else:
                        wall, ph = service(model, client, p, rng, 0)
                    write = write_once(model)
                    peak = _status("VmHWM") - base
                    if pool_block is not None:
                        pool_block.__exit__(None, None, None)
                    del model
                    gc.collect()
                    print(f"{name} {'rep' if timed else 'warm-up'} {i + 1}: {p} {wall:.3f} s "
                          f"+ first write {write:.3f} s, peak +{peak / 1e9:.2f} GB",
                          file=sys.stderr)
                    if timed:
                        times[p].append(wall)
                        writes[p].append(write)
                        phases[p].append(ph)
                        peaks[p].append(peak)
                if timed:   # in every repetition, next to the stream paths
                    tcp.append(raw_tcp(nbytes))
                    model = build(name)
                    wall, got = grpc_receive(model, client, rng, 0)
                    del model
                    gc.collect()
                    grpc_only.append(got / wall)
            results.append({"model": name, "rng": rng, "bytes": nbytes, "times": times,
                            "writes": writes,
                            "phases": phases, "peaks": peaks, "tcp": tcp,
                            "grpc": grpc_only})
        client.close()
        grpcio_client.close()
        svc.check_idle()
        if huge_svc:
            huge_client.close()
            huge_svc.check_idle()
    finally:
        svc.stop()
        if huge_svc:
            huge_svc.stop()
            bench_run.unmount(huge_dir)

    table = tables(results, args.reps)
    print(table)
    if args.write:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-", f"{mach['cpu']} {mach['cores']}c".lower()).strip("-")
        body = "\n".join([
            f"## Trainer SDK: {mach['cpu']}, {mach['cores']} cores, {mach['ram']}",
            "",
            f"- command: `{command}` (or `./dev bench sdk --write`)",
            f"- date: {date}",
            f"- machine: {mach['cpu']} ({mach['cores']} cores), {mach['ram']}, "
            f"{platform.system()} {platform.release()}",
            f"- software: torch {torch.__version__}, Python {platform.python_version()}, "
            f"commit {bench_run.git_commit()}",
            f"- threads: {args.threads} on both sides; 1-minute load average "
            f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after (the machine is "
            "shared: ratios within a run compare like with like, absolute times do not)",
            f"- server: `{bench_run.shown_command(svc.cmd)}`",
            *([f"- 'shm, pool': a server started for each of its measurements with "
               f"`--shm_pool_bytes={args.pool}`"
               + (" (the default)" if args.pool == "auto" else "")
               + ", warmed by one shm load of the same model, its pool full; stopped "
               "after"] if pooled else []),
            "- 'shm, fresh pages': the long-running server above (`--shm_pool_bytes=0`)",
            *(["- 'huge pages' paths: `--shm_dir` on a tmpfs mounted `huge=within_size` "
               "('shm, fresh huge pages': a second long-running server without a pool; "
               "'shm, pool, huge pages': the pooled server with it)"] if huge_svc else []),
            "",
            table,
        ])
        bench_run.write_results(key, body, mark="bench/sdk.py")
        print(f"updated {os.path.relpath(bench_run.RESULTS)}", file=sys.stderr)


def tables(results, reps):
    med, spread = bench_run.med, bench_run.spread
    out = [f"Time until the trainer's module holds initialized weights it can train, "
           "from the model built on the meta device: the call, then the first write "
           "of every weight (x *= 1 over all parameters, what the first optimizer "
           f"step does to memory). Median of {reps} repetitions (min–max), "
           "milliseconds; ratio = path / in-process, both with the first write (< 1: "
           "faster than doing it in this process); read-only = the call alone against "
           "in-process (inference, evaluation). Peak = growth of this process's peak "
           "RSS during the path.", "",
           "| model | rng | bytes | path | ready to train | ratio | first write "
           "| read-only ratio | describe / materialize / load | peak RSS |",
           "|---|---|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in results:
        ready = {p: [t + w for t, w in zip(ts, r["writes"][p])] for p, ts in r["times"].items()}
        base = med(ready["in-process"])
        base_call = med(r["times"]["in-process"])
        for p, ts in r["times"].items():
            ph = r["phases"][p]
            parts = "–"
            if ph and ph[0]:
                parts = " / ".join(fmt_ms(med([x[k] for x in ph])) for k in ("describe", "materialize", "load"))
            out.append(f"| {r['model']} | {r['rng']} | {r['bytes'] / 1e9:.2f} GB | {p} "
                       f"| {spread(ready[p])} | **{med(ready[p]) / base:.2f}** "
                       f"| {fmt_ms(med(r['writes'][p]))} | {med(ts) / base_call:.2f} | {parts} "
                       f"| {med(r['peaks'][p]) / 1e9:.2f} GB |")
    out.append("")
    out.append("Stream throughput: the tensor bytes over the load phase of a stream "
               "path with one handle (fetch into the module, XXH3 check; in parts, the "
               "load phase also waits for the server's init of the later parts), next "
               "to a raw TCP stream of the same bytes over loopback into a preallocated buffer (sendall / "
               "recv_into) and to grpcio receiving the same FetchWeights stream and "
               "dropping each chunk (no copy, no hash: the ceiling of a grpcio client), "
               "both measured in every repetition next to the paths above; medians.")
    out.append("")
    out.append("| model | path | stream load | raw TCP | grpcio receive only "
               "| stream / raw TCP | stream / grpcio receive |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        tcp = med(r["tcp"])
        grpc_rate = med(r["grpc"])
        one = "stream, one handle" if "stream, one handle" in r["times"] else "stream"
        for p in (one, "stream x2", "stream grpcio"):
            load = med([x["load"] for x in r["phases"][p]])
            rate = r["bytes"] / load
            out.append(f"| {r['model']} | {p} | {rate / 1e9:.2f} GB/s "
                       f"| {r['bytes'] / tcp / 1e9:.2f} GB/s | {grpc_rate / 1e9:.2f} GB/s "
                       f"| **{tcp / load:.2f}** | **{rate / grpc_rate:.2f}** |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
