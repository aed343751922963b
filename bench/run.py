#!/usr/bin/env python3
"""Materialize through materializerd vs. the same work in-process in torch.

One run starts its own server (`--listen=127.0.0.1:0 --devices=cpu`) and, for
each model, alternates N timed repetitions (after warm-up) of

  service     Materialize (sync) as a client round trip, with the server's
              own per-phase timings (PhaseTimings); Release after each rep
              (not timed).
  in-process  torch.empty(shape, dtype, device="meta") for every tensor,
              then to_empty on the CPU (torch.empty_like(meta, device="cpu")),
              then the request's nn.init calls, each with its own
              torch.Generator seeded like the service (RNG_MODE_TORCH), one
              tensor after the other.

Reports medians and the ratio service / in-process. Both sides get the same
thread count (torch.set_num_threads here, OMP_NUM_THREADS/MKL_NUM_THREADS and
--workers for the server).

    .venv/bin/python bench/run.py              # print the table
    .venv/bin/python bench/run.py --write      # ... and update bench/RESULTS.md
"""

import argparse
import contextlib
import datetime
import fnmatch
import json
import os
import platform
import queue
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "RESULTS.md")
MODELS = {"gpt2-small": "gpt2-small.json", "llama-1b": "llama-1b.json",
          "llama-small": "llama-small.json", "mlp": "mlp.json"}

MASK64 = (1 << 64) - 1
DTYPES = {
    "float32": torch.float32, "float64": torch.float64,
    "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}
FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2}
PHASES = ["validate_us", "plan_us", "reserve_us", "allocate_us", "init_us",
          "register_us", "total_us"]


# ---------------------------------------------------------------------------
# The in-process baseline
# ---------------------------------------------------------------------------

def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(seed, name):
    return splitmix64((seed ^ splitmix64(fnv1a64(name.encode()))) & MASK64)


def resolve(model):
    """[(name, shape, dtype, scheme, params)] with the API's precedence:
    the tensor's own init, else the first matching rule."""
    out = []
    rules = model.get("initRules", [])
    for t in model["tensors"]:
        init = t.get("init")
        if init is None:
            init = next((r["init"] for r in rules
                         if fnmatch.fnmatchcase(t["name"], r["pattern"])), None)
        if init is None:
            raise SystemExit(f"{t['name']}: no init rule covers it")
        (scheme, params), = init.items()
        out.append((t["name"], [int(s) for s in t.get("shape", [])],
                    DTYPES[t["dtype"]], scheme, params))
    return out


def init_(t, scheme, params, g):
    nn = torch.nn.init
    if scheme == "zeros":
        nn.zeros_(t)
    elif scheme == "ones":
        nn.ones_(t)
    elif scheme == "constant":
        nn.constant_(t, params.get("val", 0.0))
    elif scheme == "normal":
        nn.normal_(t, params.get("mean", 0.0), params.get("std", 1.0), generator=g)
    elif scheme == "uniform":
        nn.uniform_(t, params.get("a", 0.0), params.get("b", 1.0), generator=g)
    else:
        raise SystemExit(f"unknown scheme {scheme}")


def in_process(tensors, seed):
    """One repetition; returns (phase seconds, the tensors)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    metas = [torch.empty(shape, dtype=dt, device="meta")
             for _, shape, dt, _, _ in tensors]
    t1 = time.perf_counter()
    real = [torch.empty_like(m, device="cpu") for m in metas]  # to_empty
    t2 = time.perf_counter()
    for (name, _, dt, scheme, params), t in zip(tensors, real):
        if t.numel() == 0:
            continue
        g = (torch.Generator().manual_seed(derive_seed(seed, name))
             if scheme in ("normal", "uniform") else None)
        if dt in FLOAT8:
            wide = torch.empty(t.shape, dtype=torch.float32)
            init_(wide, scheme, params, g)
            t.copy_(wide)
        else:
            init_(t, scheme, params, g)
    t3 = time.perf_counter()
    return {"meta": t1 - t0, "allocate": t2 - t1, "init": t3 - t2,
            "total": t3 - t0, "cpu": time.process_time() - c0}, real


# ---------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------

class Service:
    """A materializerd for a benchmark. Without a pool (--shm_pool_bytes=0)
    unless `extra_args` names one: a long-running server's default pool
    refills after each export, on the cores the next measurement needs;
    pooled_service measures the pool, alone."""

    def __init__(self, binary, proto_dir, threads, extra_args=()):
        if not os.path.exists(binary):
            raise SystemExit(f"{binary} not found: build it first "
                             "(./dev build, or bazel build //server:materializerd)")
        if not os.path.exists(os.path.join(proto_dir, "materializer", "v1",
                                           "materializer_pb2.py")):
            raise SystemExit(f"no generated protos under {proto_dir}: "
                             "bazel build //proto:materializer_py")
        sys.path.insert(0, proto_dir)
        import grpc
        from google.protobuf import json_format
        from materializer.v1 import materializer_pb2, materializer_pb2_grpc
        self.pb, self.json_format = materializer_pb2, json_format
        env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        self.cmd = [binary, "--listen=127.0.0.1:0", "--devices=cpu",
                    f"--workers={threads}", "--log_level=warning", *extra_args]
        if not any(a.startswith("--shm_pool_bytes") for a in extra_args):
            self.cmd.append("--shm_pool_bytes=0")
        import tempfile
        self.log = tempfile.NamedTemporaryFile(
            prefix="materializerd-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE,
                                     stderr=self.log, stdin=subprocess.DEVNULL,
                                     env=env)
        lines = queue.Queue()

        def read():
            for line in iter(self.proc.stdout.readline, b""):
                lines.put(line.decode("utf-8", "replace"))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        address = None
        deadline = time.monotonic() + 120
        while address is None:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                raise SystemExit(f"materializerd exited with {self.proc.wait()}; "
                                 f"log: {self.log.name}")
            m = re.match(r"materializerd listening on (\S+)", line)
            if m:
                address = m.group(1)
        self.address = address
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = materializer_pb2_grpc.MaterializerStub(self.channel)

    def request(self, path):
        with open(path, encoding="utf-8") as f:
            return self.json_format.Parse(f.read(), self.pb.MaterializeRequest())

    def cpu_seconds(self):
        """User + system CPU time of the server process, all threads."""
        with open(f"/proc/{self.proc.pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def materialize(self, req):
        """One repetition: (round trip seconds, server phase seconds); the
        phases include "cpu", the server's CPU seconds during the call."""
        c0 = self.cpu_seconds()
        t0 = time.perf_counter()
        resp = self.stub.Materialize(req, timeout=3600)
        wall = time.perf_counter() - t0
        cpu = self.cpu_seconds() - c0
        if resp.state != self.pb.HANDLE_STATE_READY:
            raise SystemExit(f"Materialize returned state {resp.state}")
        phases = {p[:-3]: getattr(resp.timings, p) / 1e6 for p in PHASES}
        phases["cpu"] = cpu
        self.stub.Release(self.pb.ReleaseRequest(handle=resp.handle), timeout=600)
        return wall, phases

    def wait_pool_full(self, timeout=300):
        """Blocks until the server's shared-memory pool (--shm_pool_bytes)
        holds its target: the refill runs only when the server is idle, and
        a measurement must not share the cores with it. Returns the seconds
        waited."""
        t0 = time.perf_counter()
        while True:
            pool = self.stub.GetStats(self.pb.GetStatsRequest(), timeout=60).shm_pool
            if pool.target_bytes - pool.bytes < 128 << 20:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"the shared-memory pool did not refill: {pool}")
            time.sleep(0.05)

    def check_idle(self):
        s = self.stub.GetStats(self.pb.GetStatsRequest(), timeout=60)
        if s.in_use_bytes or s.reserved_bytes or s.handles:
            raise SystemExit(f"server not idle after the run: {s}")

    def stop(self):
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit("materializerd did not exit within 30 s of SIGTERM; "
                             f"log: {self.log.name}")
        if self.proc.returncode != 0:
            raise SystemExit(f"materializerd exited with {self.proc.returncode}; "
                             f"log: {self.log.name}")
        os.unlink(self.log.name)



@contextlib.contextmanager
def pooled_service(binary, proto_dir, threads, pool_bytes, extra_args=(), warm_up=None):
    """A server with a shared-memory pool of `pool_bytes` ("auto": the
    server's default, adaptive; and the default --shm_pool_quiet), alive
    only for the block: started, warmed up (`warm_up(client)`, by default a
    small model over shm; an adaptive pool learns its size from the
    warm-up's exports, so a benchmark of a model warms up with one shm load
    of that model, as the first export on a long-running server would), its
    pool full, then yielded; stopped after. One block per measurement: a call takes from
    the pool, which refills only after the server has been quiet.
    Alive only while its own measurement runs, because a pool keeps
    gigabytes resident, and with two servers, their checkpoint caches and
    the page cache, the other paths would run with much less free memory
    than they do alone."""
    svc = Service(binary, proto_dir, threads,
                  extra_args=[f"--shm_pool_bytes={pool_bytes}", *extra_args])
    try:
        import materializer
        client = materializer.Client(svc.address)
        if warm_up is None:
            import torch
            with torch.device("meta"):
                tiny = torch.nn.Linear(64, 64)
            materializer.materialize(tiny, client=client, transport="shm", progress=False)
        else:
            warm_up(client)
        client.close()
        svc.wait_pool_full()
        yield svc
        svc.check_idle()
    finally:
        svc.stop()


def mount_huge_tmpfs():
    """A tmpfs mounted huge=within_size under the temporary directory (as
    root), for a server's --shm_dir (docs/operations.md, "Huge pages for
    shared memory"); returns its path."""
    where = tempfile.mkdtemp(prefix="materializer-huge-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12g,huge=within_size,mode=1777",
                    "tmpfs", where], check=True)
    return where


def unmount(where):
    subprocess.run(["umount", "--lazy", where], check=False)  # mappings may outlive it
    os.rmdir(where)


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------

def shown_args(argv):
    """A benchmark's arguments as RESULTS.md shows them: without --server
    and --proto (with their values), which are this machine's paths, not
    the method."""
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--server", "--proto"):
            skip = True
        elif not a.startswith(("--server=", "--proto=")):
            shown.append(shlex.quote(a))
    return shown


def shown_command(cmd):
    """`cmd` as RESULTS.md shows it: paths relative to the checkout, and a
    binary from Bazel's output tree as bazel-bin/... (never this machine's
    own paths)."""
    def shown(c):
        if not os.path.isabs(c):
            return c
        rel = os.path.relpath(c, REPO)
        if not rel.startswith(".."):
            return rel
        return "bazel-bin/" + c.split("/bin/", 1)[1] if "/bin/" in c else os.path.basename(c)
    return " ".join(shown(c) for c in cmd)


def machine():
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "unknown RAM"
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram = f"{int(line.split()[1]) / (1 << 20):.1f} GiB RAM"
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram": ram}


def git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ms(seconds):
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:,.1f}"


def med(xs):
    return statistics.median(xs)


def spread(xs):
    return f"{ms(med(xs))} ({ms(min(xs))}–{ms(max(xs))})"


def tables(results, reps):
    out = []
    out.append(f"Median of {reps} repetitions (min–max), milliseconds; "
               "ratio = service round trip / in-process total (< 1: the "
               "service is faster).")
    out.append("")
    out.append("| model | params | bytes | service round trip | in-process total "
               "| ratio | cores used: service / in-process |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = med(r["svc_wall"]) / med([p["total"] for p in r["inproc"]])
        svc_cores = med([p["cpu"] / w for p, w in zip(r["svc_phases"], r["svc_wall"])])
        ip_cores = med([p["cpu"] / p["total"] for p in r["inproc"]])
        out.append(f"| {r['model']} | {r['params']:,} | {r['bytes'] / 1e9:.2f} GB "
                   f"| {spread(r['svc_wall'])} "
                   f"| {spread([p['total'] for p in r['inproc']])} "
                   f"| **{ratio:.2f}** | {svc_cores:.2f} / {ip_cores:.2f} |")
    out.append("")
    out.append("Cores used = CPU time (user + system, all threads) / wall time: "
               "the server process during the call, this process during "
               "the in-process run.")
    out.append("")
    out.append("Per phase (medians, ms). Service: the server's PhaseTimings; "
               "\"rpc\" = round trip minus server total (client, gRPC, "
               "transport). In-process: meta = building meta tensors "
               "(the counterpart of validate + plan).")
    out.append("")
    out.append("| model | side | validate + plan / meta | reserve | allocate | init "
               "| register | rpc | total | init ratio |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        sp = {k: med([p[k] for p in r["svc_phases"]]) for k in r["svc_phases"][0]}
        ip = {k: med([p[k] for p in r["inproc"]]) for k in r["inproc"][0]}
        rpc = med([w - p["total"] for w, p in zip(r["svc_wall"], r["svc_phases"])])
        out.append(f"| {r['model']} | service | {ms(sp['validate'] + sp['plan'])} "
                   f"| {ms(sp['reserve'])} | {ms(sp['allocate'])} | {ms(sp['init'])} "
                   f"| {ms(sp['register'])} | {ms(rpc)} | {ms(sp['total'])} "
                   f"| {sp['init'] / ip['init']:.2f} |")
        out.append(f"| {r['model']} | in-process | {ms(ip['meta'])} | – "
                   f"| {ms(ip['allocate'])} | {ms(ip['init'])} | – | – "
                   f"| {ms(ip['total'])} | 1 |")
    return "\n".join(out)


INTRO = """# Benchmark results

Written by `bench/run.py --write` (see `bench/README.md`). All comparisons
are ratios against a baseline measured in the same run, on the same machine,
with the same thread count: the same model materialized in-process by torch
(meta tensors -> `to_empty` on the CPU -> `nn.init` with per-tensor
generators). Absolute times are shown only for context; they are not
comparable across machines. One section per machine; a new run on the same
machine replaces its section.
"""


def write_results(section_key, body, mark="bench/run.py"):
    """Replaces the section that `mark` (the writing script) keeps for this
    machine in bench/RESULTS.md, or appends it; other sections stay."""
    text = open(RESULTS, encoding="utf-8").read() if os.path.exists(RESULTS) else INTRO
    begin = f"<!-- {mark}: {section_key} -->"
    end = f"<!-- /{mark}: {section_key} -->"
    block = f"{begin}\n{body}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        # A placeholder ("not yet measured") sits inside its own section's
        # markers, so the first real results replace it and nothing else.
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(RESULTS, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-small,llama-1b",
                    help=f"comma list of {', '.join(MODELS)} (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed repetitions per model and side first")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both sides (default: os.cpu_count())")
    ap.add_argument("--server", default=os.environ.get(
        "MATERIALIZERD", os.path.join(REPO, "bazel-bin", "server", "materializerd")))
    ap.add_argument("--proto", default=os.environ.get(
        "MATERIALIZER_PY_PROTO", os.path.join(REPO, "bazel-bin", "proto")))
    ap.add_argument("--write", action="store_true",
                    help="also replace this machine's section of bench/RESULTS.md")
    args = ap.parse_args()
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        ap.error(f"unknown model(s) {', '.join(sorted(unknown))}; "
                 f"choose from {', '.join(MODELS)}")
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    command = " ".join([".venv/bin/python", "bench/run.py"]
                       + [shlex.quote(a) for a in sys.argv[1:]])

    torch.set_num_threads(args.threads)
    mach = machine()
    print(f"# {mach['cpu']}, {mach['cores']} cores, {mach['ram']}; torch "
          f"{torch.__version__}, {args.threads} threads on both sides",
          file=sys.stderr)

    svc = Service(args.server, args.proto, args.threads)
    results = []
    try:
        for model in args.models.split(","):
            path = os.path.join(REPO, "examples", MODELS[model])
            with open(path, encoding="utf-8") as f:
                model_json = json.load(f)["model"]
            tensors = resolve(model_json)
            seed = int(model_json.get("seed", "0"))
            req = svc.request(path)
            params = sum(torch.Size(s).numel() for _, s, _, _, _ in tensors)
            nbytes = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
                         for _, s, d, _, _ in tensors)
            r = {"model": model, "params": params, "bytes": nbytes,
                 "svc_wall": [], "svc_phases": [], "inproc": []}
            for i in range(args.warmup + args.reps):
                timed = i >= args.warmup
                wall, phases = svc.materialize(req)
                ip, real = in_process(tensors, seed)
                del real
                tag = "rep" if timed else "warm-up"
                print(f"{model} {tag} {i - args.warmup + 1 if timed else i + 1}: "
                      f"service {wall:.3f} s (server {phases['total']:.3f} s), "
                      f"in-process {ip['total']:.3f} s", file=sys.stderr)
                if timed:
                    r["svc_wall"].append(wall)
                    r["svc_phases"].append(phases)
                    r["inproc"].append(ip)
            results.append(r)
        svc.check_idle()
    finally:
        svc.stop()

    table = tables(results, args.reps)
    print(table)
    if args.write:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        key = re.sub(r"[^a-z0-9]+", "-",
                     f"{mach['cpu']} {mach['cores']}c".lower()).strip("-")
        body = "\n".join([
            f"## {mach['cpu']}, {mach['cores']} cores, {mach['ram']}",
            "",
            f"- command: `{command}`",
            f"- date: {date}",
            f"- machine: {mach['cpu']} ({mach['cores']} cores), {mach['ram']}, "
            f"{platform.system()} {platform.release()}",
            f"- software: torch {torch.__version__}, Python "
            f"{platform.python_version()}, commit {git_commit()}",
            f"- threads: {args.threads} on both sides (torch.set_num_threads "
            f"in-process; OMP_NUM_THREADS/MKL_NUM_THREADS and --workers for "
            f"the server); in-process init runs tensor after tensor",
            f"- server: `{shown_command(svc.cmd)}`",
            "",
            table,
        ])
        write_results(key, body)
        print(f"updated {os.path.relpath(RESULTS)}", file=sys.stderr)


if __name__ == "__main__":
    main()
