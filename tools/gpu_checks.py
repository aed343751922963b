#!/usr/bin/env python3
"""The checks of the GPU run. tools/gpu_run.py runs each in a child process
of its own (a crash or a hang then costs one check, not the run):

    gpu_checks.py NAME --context CONTEXT.json --result RESULT.json
    gpu_checks.py probe          # one JSON line: torch, CUDA, versions

A check writes {"status": PASS|FAIL|SKIP, "figures": {...}, "detail": ...}.
In the GPU mode the devices are the GPU's; rehearsing (--rehearse-cpu) the
same code runs against CPU devices (server a: cpu; server b: cpu:0 and
cpu:1 standing in for the GPU and the CPU), CPU generators and shared
memory, so only the GPU parts are left for the GPU machine. A check that
can only run on a GPU says SKIP when rehearsing, and FAIL when a GPU run
cannot run it. The benchmark steps (bench_*) are in bench/gpu_bench.py.
"""

import argparse
import ast
import json
import os
import pathlib
import platform
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ElementTree

REPO = pathlib.Path(__file__).resolve().parent.parent
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
MIB = 1 << 20
CLIENT = "gpu-run"
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16", "float8_e4m3fn",
                "float8_e5m2"]


class Outcome(Exception):
    """Ends a check early with a status (SKIP, or FAIL with the reason)."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status, self.detail = status, detail


def fail(detail):
    raise Outcome(FAIL, detail)


def expect(condition, detail):
    if not condition:
        fail(detail)


class Context:
    """The run's context (written by gpu_run.py) and clients of its servers."""

    def __init__(self, data):
        self.data = data
        self.gpu = data["mode"] == "gpu"
        self.quick = data["quick"]
        self.repo = pathlib.Path(data["repo"])
        self.bin = pathlib.Path(data["bin"])
        self.tests = pathlib.Path(data["tests"])
        self.proto = data["proto"]
        self.devices = data["devices"]
        self.grace_s = data["grace_s"]
        self.scratch = pathlib.Path(data["scratch"])
        self.deadline = time.monotonic() + data["budget_s"]
        self.manifest = data["manifest"]
        os.environ["MATERIALIZER_PY_PROTO"] = self.proto
        os.environ["MATERIALIZERD"] = str(self.bin / "materializerd")
        for path in (self.repo / "python", self.repo / "tests" / "python",
                     self.repo / "bench", pathlib.Path(self.proto)):
            if str(path) not in sys.path:
                sys.path.insert(0, str(path))
        self._servers = {}

    def left(self):
        return self.deadline - time.monotonic()

    def server(self, key):
        """A serverproc.Server (stub and helpers) for running server `key`."""
        if key not in self._servers:
            info = self.data["servers"].get(key)
            if info is None:
                fail(f"server {key} is not running")
            import serverproc
            pb, pb_grpc = serverproc.import_protos()
            srv = serverproc.Server(info["address"], pb, pb_grpc)
            srv.pid = info["pid"]
            self._servers[key] = srv
        return self._servers[key]

    def child_env(self):
        return dict(os.environ, MATERIALIZER_PY_PROTO=self.proto,
                    MATERIALIZERD=str(self.bin / "materializerd"))


def parse(srv, request):
    return srv.parse_request(json.dumps(request))


def materialize(srv, request, client=CLIENT):
    return srv.materialize(parse(srv, request), client)


def release_all(srv, client=CLIENT):
    """Releases whatever `client` still holds (after a failed check)."""
    try:
        for h in srv.stub.ListHandles(srv.pb.ListHandlesRequest(),
                                      metadata=srv.md(client), timeout=30).handles:
            srv.stub.Release(srv.pb.ReleaseRequest(handle=h.handle, force=True),
                             metadata=srv.md(client), timeout=60)
    except Exception:  # noqa: BLE001 - best effort cleanup
        pass


def tensors_of_file(blob):
    """{name: bytes} of a fetched safetensors file (parsed here rather than
    with matutil, which imports torch: most checks need no torch)."""
    (n,) = struct.unpack("<Q", blob[:8])
    header, start = json.loads(blob[8:8 + n].decode("utf-8")), 8 + n
    header.pop("__metadata__", None)
    return {n: blob[start + h["data_offsets"][0]:start + h["data_offsets"][1]]
            for n, h in header.items()}


def fetch_file(srv, handle, client=CLIENT, **kw):
    """(file bytes, the stream's file digest), checking the framing."""
    chunks = srv.fetch_chunks(handle, client, **kw)
    expect(chunks, "FetchWeights sent no chunk")
    total, pos, parts = chunks[0].total_bytes, 0, []
    for c in chunks:
        expect(c.offset == pos and c.total_bytes == total,
               f"chunk framing: offset {c.offset} at {pos}")
        parts.append(c.data)
        pos += len(c.data)
    expect(pos == total, f"stream ended at {pos} of {total} bytes")
    return b"".join(parts), chunks[-1].digest


def digest_of(data):
    from materializer import digest
    return digest.of_bytes(data)


# ---------------------------------------------------------------------------
# Driver memory (the GPU) or the server's resident memory (rehearsal)
# ---------------------------------------------------------------------------

class MemoryProbe:
    """Bytes in use as the system counts them: on a GPU, the device's used
    memory from NVML (nvidia-smi if NVML cannot be loaded) and the server
    process's own share; rehearsing, the server's resident set."""

    def __init__(self, ctx, pid):
        self.ctx, self.pid = ctx, pid
        self.nvml = None
        self.source = "rss"
        if ctx.gpu:
            try:
                import pynvml
                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                self.source = "nvml"
            except Exception:  # noqa: BLE001 - NVML missing: nvidia-smi
                self.source = "nvidia-smi"

    def used(self):
        if self.source == "nvml":
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        if self.source == "nvidia-smi":
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "--id=0"], capture_output=True, text=True, timeout=10).stdout
            return int(float(out.strip().splitlines()[0])) * MIB
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        fail(f"no VmRSS for pid {self.pid}")

    def process_used(self):
        """The server process's own bytes on the GPU, if NVML lists it."""
        if self.source != "nvml":
            return None
        try:
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == self.pid:
                    return int(p.usedGpuMemory or 0)
        except Exception:  # noqa: BLE001
            return None
        return None

    def tolerance(self):
        # The driver's figure is exact to the MiB; a resident set moves
        # with the allocator's own pages.
        return 2 * MIB if self.ctx.gpu else 24 * MIB


def pinned_mapping_bytes(pid):
    """Bytes of the process's mappings of NVIDIA device files (where the
    driver maps pinned host buffers), from /proc/PID/maps."""
    total = 0
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[5].startswith("/dev/nvidia"):
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    total += hi - lo
    except OSError:
        return None
    return total


# ---------------------------------------------------------------------------
# probe (no context: run by gpu_run.py before anything else)
# ---------------------------------------------------------------------------

def probe():
    from importlib import metadata
    info = {"python": platform.python_version()}
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["torch_dir"] = os.path.dirname(torch.__file__)
    try:
        info["cuda_devices"] = torch.cuda.device_count()
    except Exception as error:  # noqa: BLE001
        info["cuda_devices"] = 0
        info["cuda_error"] = str(error)
    if info["cuda_devices"]:
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = p.name
        info["gpu_mib"] = p.total_memory >> 20
        info["capability"] = f"{p.major}.{p.minor}"
    try:
        import pynvml
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001
        smi = shutil.which("nvidia-smi")
        if smi:
            out = subprocess.run([smi, "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip()
            info["driver"] = out.splitlines()[0] if out else "unknown"
    versions = {}
    for dist in ("numpy", "grpcio", "protobuf", "xxhash", "psutil", "pytest",
                 "nvidia-ml-py", "safetensors", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    info["packages"] = versions
    info["cpus"] = os.cpu_count()
    print(json.dumps(info))


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------

def check_server_auto(ctx, figures):
    """--devices=auto serves the GPU (every CUDA device), and a request with
    placement auto lands there."""
    srv = ctx.server("a")
    stats = srv.stats(CLIENT)
    devices = [d.device for d in stats.devices]
    figures["devices"] = ",".join(devices)
    figures["capacity_gib"] = {d.device: round(d.capacity_bytes / 2**30, 1)
                               for d in stats.devices}
    for d in stats.devices:
        if d.HasField("driver") and d.driver.total_bytes:
            figures["driver_used_mib"] = d.driver.used_bytes >> 20
    if ctx.gpu:
        expect(devices and all(d.startswith("cuda:") for d in devices)
               and "cuda:0" in devices,
               f"--devices=auto serves {devices}, not the GPUs")
    else:
        expect(devices == ["cpu"], f"--devices=auto serves {devices}, not cpu")
    req = {"model": {"tensors": [{"name": "probe.w", "shape": [256, 1024],
                                  "dtype": "float32"}],
                     "initRules": [{"pattern": "*", "init": {"normal": {"std": 0.02}}}]}}
    resp = materialize(srv, req)
    figures["auto_placed_on"] = resp.device
    srv.release(resp.handle, CLIENT)
    expect(resp.device == ctx.devices["a_gpu"],
           f"placement auto chose {resp.device}, not {ctx.devices['a_gpu']}")
    srv.assert_idle(CLIENT)
    return PASS, ""


GTEST_COUNT = re.compile(r"^\[  (PASSED|SKIPPED|FAILED) +\] (\d+) tests?", re.M)


def check_gpu_tests_cpp(ctx, figures):
    """Every C++ test tagged requires-gpu, from the carry. Rehearsing they
    skip (no GPU); on the GPU a skip is a failure."""
    tests = ctx.manifest.get("requires_gpu_tests", {})
    if not tests:
        return SKIP, "no C++ test is tagged requires-gpu"
    statuses, details = [], []
    for label, rel in tests.items():
        binary = ctx.tests / pathlib.Path(rel).name
        start = time.monotonic()
        try:
            out = subprocess.run([str(binary)], capture_output=True, text=True,
                                 timeout=max(5, ctx.left() - 5))
        except subprocess.TimeoutExpired:
            figures[label] = {"status": "timeout"}
            statuses.append(FAIL)
            details.append(f"{label}: timed out")
            break
        text = out.stdout + out.stderr
        print(f"===== {label} (rc {out.returncode}) =====\n{text}")
        counts = {k.lower(): int(v) for k, v in GTEST_COUNT.findall(text)}
        entry = dict(counts, rc=out.returncode,
                     seconds=round(time.monotonic() - start, 1))
        figures[label] = entry
        if out.returncode != 0 or counts.get("failed"):
            statuses.append(FAIL)
            failed = re.findall(r"^\[  FAILED  \] (\S+)", text, re.M)
            details.append(f"{label}: failed {sorted(set(failed))} "
                           f"{text[-600:]}")
        elif counts.get("skipped") and not counts.get("passed"):
            reason = re.search(r"Skipped\n(.*)", text)
            why = reason.group(1).strip() if reason else "skipped"
            statuses.append(FAIL if ctx.gpu else SKIP)
            details.append(f"{label}: skipped ({why})")
        else:
            statuses.append(PASS)
    status = FAIL if FAIL in statuses else SKIP if all(
        s == SKIP for s in statuses) else PASS
    return status, "; ".join(details)


def requires_gpu_python_tests(repo):
    """Node ids of tests/python tests whose docstring starts "requires-gpu"."""
    ids = []
    for path in sorted((repo / "tests" / "python").glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                doc = ast.get_docstring(node) or ""
                if doc.startswith("requires-gpu"):
                    ids.append(f"{path.relative_to(repo)}::{node.name}")
    return ids


def check_gpu_tests_python(ctx, figures):
    """The Python tests marked requires-gpu, against the carry's server."""
    ids = requires_gpu_python_tests(ctx.repo)
    figures["tests"] = len(ids)
    if not ids:
        return SKIP, "no Python test is marked requires-gpu"
    junit = ctx.scratch / "gpu-tests-python.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
           f"--junitxml={junit}", *ids]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ctx.repo,
                             env=ctx.child_env(), timeout=max(5, ctx.left() - 5))
    except subprocess.TimeoutExpired:
        fail("pytest timed out")
    print(out.stdout + out.stderr)
    expect(junit.exists(), f"pytest wrote no report (rc {out.returncode}): "
           f"{out.stdout[-800:]}{out.stderr[-400:]}")
    statuses, details = [], []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        node = case.find("failure")
        if node is None:
            node = case.find("error")
        if node is not None:
            statuses.append(FAIL)
            details.append(f"{name}: {(node.get('message') or '')[:400]}")
        elif case.find("skipped") is not None:
            statuses.append(FAIL if ctx.gpu else SKIP)
            details.append(f"{name}: skipped ({case.find('skipped').get('message')})")
        else:
            statuses.append(PASS)
        figures[name] = statuses[-1]
    expect(statuses, f"pytest ran nothing (rc {out.returncode})")
    status = FAIL if FAIL in statuses else SKIP if all(
        s == SKIP for s in statuses) else PASS
    return status, "; ".join(details)


def check_portable_random(ctx, figures):
    """portable_cuda_check: random cases, the CUDA kernel against the CPU
    byte for byte (rehearsing: the widest CPU path against the scalar one)."""
    cases = 60 if ctx.quick else 400
    target = ["--target=cuda"] if ctx.gpu else ["--target=auto", "--reference=scalar"]
    cmd = [str(ctx.bin / "portable_cuda_check"), f"--cases={cases}",
           "--seed=20261201", *target]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=max(5, ctx.left() - 3))
    except subprocess.TimeoutExpired:
        fail(f"{' '.join(cmd)} timed out")
    print(out.stdout + out.stderr)
    try:
        summary = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        fail(f"no summary (rc {out.returncode}): {out.stderr[-600:]}")
    figures.update({k: v for k, v in summary.items() if k != "failures"})
    if out.returncode == 2:
        return (FAIL if ctx.gpu else SKIP), summary.get("error", "")
    if out.returncode != 0:
        return FAIL, f"{summary.get('mismatches')} of {cases} cases differ: " \
                     f"{json.dumps(summary.get('failures'))[:1500]}"
    note = "" if ctx.gpu else \
        "rehearsal: the widest CPU path against the scalar one (no CUDA here)"
    return PASS, note


# Portable schemes for the server-level comparison: JSON init and, for the
# ones with a direct NumPy reference, its distribution and parameters.
def random_portable_scheme(rnd, rank):
    kind = rnd.choice(["uniform", "normal", "truncNormal", "constant"] +
                      (["xavierUniform", "kaimingNormal"] if rank >= 2 else []))
    if kind == "uniform":
        a = round(rnd.uniform(-2, 1), 3)
        b = round(a + rnd.uniform(0.01, 3), 3)
        return {kind: {"a": a, "b": b}}, ("uniform", {"a": a, "b": b})
    if kind == "normal":
        p = {"mean": round(rnd.uniform(-1, 1), 3), "std": round(rnd.uniform(0.001, 2), 4)}
        return {kind: p}, ("normal", dict(p))
    if kind == "truncNormal":
        p = {"mean": 0.0, "std": round(rnd.uniform(0.01, 1), 3), "a": -0.5, "b": 0.75}
        return {kind: p}, ("trunc_normal", dict(p))
    if kind == "constant":
        return {kind: {"val": round(rnd.uniform(-3, 3), 3)}}, None
    if kind == "xavierUniform":
        return {kind: {"gain": {"nonlinearity": "relu"}}}, None
    return {kind: {"mode": "fan_out", "nonlinearity": "relu"}}, None


def random_portable_model(rnd, count, max_dim, max_elements=1 << 18):
    tensors, refs = [], {}
    for i in range(count):
        rank = rnd.choice([1, 2, 2, 3])
        shape, budget = [], max_elements
        for _ in range(rank):
            size = rnd.randint(1, max(1, min(max_dim, budget)))
            shape.append(size)
            budget //= size
        dtype = rnd.choice(FLOAT_DTYPES)
        init, ref = random_portable_scheme(rnd, rank)
        t = {"name": f"layers.{i}.weight", "shape": shape, "dtype": dtype,
             "init": init}
        box = None
        if rnd.random() < 0.4:
            offsets = [rnd.randint(0, s - 1) for s in shape]
            lengths = [rnd.randint(1, s - o) for s, o in zip(shape, offsets)]
            t["shard"] = {"box": [{"offset": o, "length": n}
                                  for o, n in zip(offsets, lengths)]}
            box = (tuple(offsets), tuple(lengths))
        tensors.append(t)
        refs[t["name"]] = (dtype, shape, box, ref)
    return tensors, refs


def check_portable_server(ctx, figures):
    """Portable handles through the server: random tensors (dtypes, shapes,
    shard boxes, schemes) materialized on the GPU equal, byte for byte, the
    same request on the CPU, and the NumPy reference (docs/portable-rng.md)
    where it is cheap to compute; the Describe digests agree too."""
    import numpy as np
    import portable_ref
    rnd = random.Random(20261201)
    count, max_dim = (10, 40) if ctx.quick else (40, 300)
    tensors, refs = random_portable_model(rnd, count, max_dim)
    if not ctx.quick:  # one large tensor: the kernel's grid-stride loop
        tensors.append({"name": "big.weight", "shape": [4096, 8192],
                        "dtype": "float32", "init": {"normal": {"std": 0.02}}})
    seed = str(rnd.getrandbits(63))
    a, b = ctx.server("a"), ctx.server("b")

    def run(srv, device):
        req = {"model": {"tensors": tensors, "seed": seed},
               "placement": {"device": device}}
        resp = materialize(srv, req)
        try:
            expect(resp.device == device, f"placed on {resp.device}, not {device}")
            info = srv.describe(resp.handle, CLIENT)
            blob, _ = fetch_file(srv, resp.handle)
        finally:
            srv.release(resp.handle, CLIENT)
        return tensors_of_file(blob), {t.name: t.digest for t in info.tensors}

    gpu_bytes, gpu_digests = run(a, ctx.devices["a_gpu"])
    cpu_bytes, cpu_digests = run(b, ctx.devices["b_cpu"])
    figures["tensors"] = len(tensors)
    figures["bytes"] = sum(len(v) for v in gpu_bytes.values())
    figures["sharded"] = sum("shard" in t for t in tensors)
    differ = [n for n in gpu_bytes if gpu_bytes[n] != cpu_bytes.get(n)]
    expect(not differ, f"GPU and CPU bytes differ for {differ[:5]}")
    expect(gpu_digests == cpu_digests, "Describe digests differ between the "
           "GPU and the CPU handle")
    checked = 0
    for name, (dtype, shape, box, ref) in refs.items():
        elements = 1
        for n in (box[1] if box else shape):
            elements *= n
        if ref is None or elements > (2000 if dtype == "float64" else 20000):
            continue
        dist, params = ref
        want = np.ascontiguousarray(portable_ref.fill(
            int(seed), name, dtype, dist, params, shape, box)).tobytes()
        expect(gpu_bytes[name] == want,
               f"{name} ({dtype}, {dist}, shape {shape}, box {box}) differs "
               "from the NumPy reference")
        checked += 1
    figures["reference_checked"] = checked
    a.assert_idle(CLIENT)
    b.assert_idle(CLIENT)
    return PASS, f"{ctx.devices['a_gpu']} vs {ctx.devices['b_cpu']}"


# Torch-mode cases: (scheme, params, shapes, dtypes)
TORCH_CASES = [
    ("normal", {"mean": 0.5, "std": 2.0}, [[37], [64, 48], [300, 257]], None),
    ("uniform", {"a": -0.25, "b": 0.75}, [[37], [300, 257]], None),
    ("trunc_normal", {}, [[37], [64, 48]], None),
    ("trunc_normal", {"mean": 0.1, "std": 0.7, "a": -1.0, "b": 2.5}, [[300, 257]], None),
    ("xavier_uniform", {"gain": {"nonlinearity": "relu"}}, [[64, 48], [6, 4, 3, 3]], None),
    ("xavier_normal", {"gain": {"value": 0.5}}, [[64, 48]], None),
    ("kaiming_uniform", {"a": 0.2, "mode": "fan_out", "nonlinearity": "leaky_relu"},
     [[64, 48], [6, 4, 3, 3]], None),
    ("kaiming_normal", {"mode": "fan_out", "nonlinearity": "relu"}, [[300, 257]], None),
    ("orthogonal", {}, [[64, 48], [7, 13]], ["float32", "float64", "bfloat16"]),
    ("sparse", {"sparsity": 0.3, "std": 0.5}, [[64, 48]], ["float32", "bfloat16"]),
    ("zeros", {}, [[37]], None),
    ("constant", {"val": -1.5}, [[64, 48]], None),
    ("empty", {}, [[300, 257]], ["float32"]),
    ("eye", {}, [[7, 13]], None),
    ("arange", {"start": 0.5, "step": 0.005}, [[37]], None),
]
TORCH_DTYPES = ["float32", "float64", "float16", "bfloat16", "float8_e4m3fn"]


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def torch_reference(shape, dtype, scheme, params, seed, name, device):
    """torch.nn.init on `device`, each tensor with its own generator of that
    device seeded with derive_seed(seed, name) (docs/init.md); schemes that
    draw nothing come from matutil.reference (the same on any device)."""
    import torch
    import matutil as m
    init = torch.nn.init
    if scheme not in ("normal", "uniform", "trunc_normal", "xavier_uniform",
                      "xavier_normal", "kaiming_uniform", "kaiming_normal",
                      "orthogonal", "sparse"):
        return m.reference(shape, dtype, scheme, params, seed, name)
    wide = dtype in m.FLOAT8 or (scheme == "orthogonal" and
                                 dtype in (torch.float16, torch.bfloat16))
    t = torch.empty(shape, dtype=torch.float32 if wide else dtype, device=device)
    d = m.derive_seed(seed, name)
    g = torch.Generator(device=device).manual_seed(d)
    p = params
    if scheme == "normal":
        t.normal_(p.get("mean", 0.0), p.get("std", 1.0), generator=g)
    elif scheme == "uniform":
        t.uniform_(p.get("a", 0.0), p.get("b", 1.0), generator=g)
    elif scheme == "trunc_normal":
        init.trunc_normal_(t, p.get("mean", 0.0), p.get("std", 1.0),
                           p.get("a", -2.0), p.get("b", 2.0), generator=g)
    elif scheme in ("xavier_uniform", "xavier_normal"):
        fn = init.xavier_uniform_ if scheme == "xavier_uniform" else init.xavier_normal_
        fn(t, gain=m.gain_value(p.get("gain")), generator=g)
    elif scheme in ("kaiming_uniform", "kaiming_normal"):
        fn = init.kaiming_uniform_ if scheme == "kaiming_uniform" else init.kaiming_normal_
        fn(t, a=p.get("a", 0), mode=p.get("mode") or "fan_in",
           nonlinearity=p.get("nonlinearity") or "leaky_relu", generator=g)
    elif scheme == "orthogonal":
        with m.one_thread():
            init.orthogonal_(t, gain=m.gain_value(p.get("gain")), generator=g)
    elif scheme == "sparse":
        torch.manual_seed(d)  # randperm draws from the default CPU generator
        init.sparse_(t, p.get("sparsity", 0.0), p.get("std", 0.01), generator=g)
    return t.to(dtype).cpu()


def check_torch_mode_cuda(ctx, figures):
    """RNG_MODE_TORCH on the GPU equals torch.nn.init run in this process on
    the same device with a generator of that device seeded the same way
    (docs/init.md), bit for bit; module defaults (Linear, Embedding) too."""
    import torch
    import matutil as m
    device = "cuda" if ctx.gpu else "cpu"
    if ctx.gpu and not torch.cuda.is_available():
        fail("torch sees no CUDA device in this process")
    seed = 20261201
    tensors, cases = [], {}
    for k, (scheme, params, shapes, dtypes) in enumerate(TORCH_CASES):
        for dtype in dtypes or TORCH_DTYPES:
            if ctx.quick and dtype in ("float64", "float8_e4m3fn"):
                continue
            for shape in shapes:
                name = f"{scheme}.{k}.{dtype}.{'x'.join(map(str, shape))}"
                tensors.append({"name": name, "shape": shape, "dtype": dtype,
                                "init": {camel(scheme): {camel(x): v for x, v
                                                         in params.items()}}})
                cases[name] = (shape, dtype, scheme, params)
    modules = [("proj", "Linear", {"weight": [32, 16], "bias": [32]}),
               ("embed", "Embedding", {"weight": [50, 8]})]
    for prefix, kind, parts in modules:
        for part, shape in parts.items():
            tensors.append({"name": f"{prefix}.{part}", "shape": shape,
                            "dtype": "float32", "moduleType": kind})
    # The module tensors have no init of their own and no rule: their
    # module type's default applies.
    req = {"model": {"tensors": tensors, "seed": str(seed),
                     "rng": "RNG_MODE_TORCH"},
           "placement": {"device": ctx.devices["a_gpu"]}}
    srv = ctx.server("a")
    resp = materialize(srv, req)
    try:
        expect(resp.device == ctx.devices["a_gpu"], f"placed on {resp.device}")
        blob, _ = fetch_file(srv, resp.handle)
    finally:
        srv.release(resp.handle, CLIENT)
    got = m.load_safetensors(blob)
    differ = []
    for name, (shape, dtype, scheme, params) in cases.items():
        want = torch_reference(shape, m.TORCH_DTYPES[dtype], scheme, params,
                               seed, name, device)
        if not m.same_bits(got[name], want):
            differ.append(name)
    # Module defaults: the module built on the device, reset with the
    # default generators seeded from the module's name.
    lin = torch.nn.Linear(16, 32, device=device)
    m.reset_module(lin, seed, "proj")
    emb = torch.nn.Embedding(50, 8, device=device)
    m.reset_module(emb, seed, "embed")
    for name, want in (("proj.weight", lin.weight), ("proj.bias", lin.bias),
                       ("embed.weight", emb.weight)):
        if not m.same_bits(got[name], want.detach().cpu()):
            differ.append(name)
    figures["tensors"] = len(tensors)
    figures["schemes"] = len({c[2] for c in cases.values()}) + len(modules)
    figures["device"] = device
    expect(not differ, f"{len(differ)} tensors differ from torch.nn.init on "
           f"{device}: {differ[:8]}")
    srv.assert_idle(CLIENT)
    return PASS, f"torch.nn.init on {device} with {device} generators"


def export_model(mib):
    return {"model": {"tensors": [
        {"name": "w", "shape": [mib, 256, 1024], "dtype": "float32"},
        {"name": "b", "shape": [33], "dtype": "bfloat16"},
        {"name": "odd", "shape": [7, 13], "dtype": "float16"},
        {"name": "e", "shape": [0], "dtype": "int64"}],
        "initRules": [{"pattern": "e", "init": {"zeros": {}}},
                      {"pattern": "*", "init": {"normal": {"std": 2}}}],
        "seed": "3"}, "exportable": True}


def check_ipc_export(ctx, figures):
    """A CUDA IPC export opened by a second process, once from Python
    (torch + cudaIpcOpenMemHandle, tests/python/delivery_cuda_importer.py)
    and once with the C++ client (bench/gpu_export_read), reads the same
    bytes as the server (Describe's digests) and as the same model
    materialized on the CPU; release is refused while it is exported.
    Rehearsing: a shared-memory export, tests/python/delivery_importer.py
    and the same C++ reader."""
    import grpc
    mib = 8 if ctx.quick else 256
    a, b = ctx.server("a"), ctx.server("b")
    req = export_model(mib)
    req["placement"] = {"device": ctx.devices["a_gpu"]}
    handle = materialize(a, req).handle
    try:
        info = a.describe(handle, CLIENT)
        expected = {t.name: t.digest for t in info.tensors}
        exported = a.stub.ExportHandle(a.pb.ExportRequest(handle=handle),
                                       metadata=a.md(CLIENT), timeout=60)
        kind = exported.WhichOneof("memory")
        figures["export"] = kind
        figures["bytes"] = exported.arena_bytes
        expect(kind == ("cuda" if ctx.gpu else "shared_memory"),
               f"the export is {kind}")
        pb_path = ctx.scratch / "export.pb"
        pb_path.write_bytes(exported.SerializeToString())
        importer = ctx.repo / "tests" / "python" / (
            "delivery_cuda_importer.py" if ctx.gpu else "delivery_importer.py")
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(importer), str(pb_path)],
                              input="\n", capture_output=True, text=True,
                              env=ctx.child_env(), timeout=max(5, ctx.left() - 10))
        figures["importer_seconds"] = round(time.monotonic() - start, 2)
        print(proc.stdout + proc.stderr)
        expect(proc.returncode == 0, f"the importer failed ({proc.returncode}): "
               f"{proc.stderr[-800:]}")
        first = json.loads(proc.stdout.strip().splitlines()[0])
        got = first.get("digests", first)
        expect(got == expected, f"the importer read other bytes: {got} vs {expected}")
        # The C++ client's importer (ExportImport + ViewAsTensors), too.
        cpp = subprocess.run([str(ctx.bin / "gpu_export_read"), str(pb_path)],
                             capture_output=True, text=True,
                             timeout=max(5, ctx.left() - 10))
        print(cpp.stdout + cpp.stderr)
        expect(cpp.returncode == 0, f"gpu_export_read failed ({cpp.returncode}): "
               f"{cpp.stderr[-800:]}")
        read = json.loads(cpp.stdout.strip().splitlines()[-1])
        figures["cpp_importer_on_cuda"] = read["on_cuda"]
        expect(read["on_cuda"] == ctx.gpu, f"C++ import on_cuda={read['on_cuda']}")
        expect(read["digests"] == expected,
               f"the C++ importer read other bytes: {read['digests']}")
        # Exported: a plain release is refused.
        try:
            a.release(handle, CLIENT)
            fail("release of an exported handle was not refused")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.FAILED_PRECONDITION,
                   f"release while exported: {e.code()}")
        closed = a.stub.CloseExport(
            a.pb.CloseExportRequest(export_id=exported.export_id),
            metadata=a.md(CLIENT), timeout=60)
        expect(closed.remaining_exports == 0, "the export did not close")
        expect(a.release(handle, CLIENT).released,
               "release after CloseExport did not release")
    finally:
        release_all(a)
    # The same model on the CPU: the same bytes (portable init).
    cpu_req = export_model(mib)
    cpu_req["placement"] = {"device": ctx.devices["b_cpu"]}
    cpu = materialize(b, cpu_req)
    cpu_digests = {t.name: t.digest for t in b.describe(cpu.handle, CLIENT).tensors}
    b.release(cpu.handle, CLIENT)
    expect(cpu_digests == expected, "the CPU materialization has other bytes")
    a.assert_idle(CLIENT)
    figures["tensors"] = len(expected)
    return PASS, ("CUDA IPC" if ctx.gpu else
                  "rehearsal: shared-memory export (CUDA IPC needs a GPU)")


def staging_model(mib):
    # Several chunks, tensors that start and end inside chunks, odd sizes.
    per = mib * MIB // 4 // 3
    return {"model": {"tensors": [
        {"name": "a.weight", "shape": [per], "dtype": "float32"},
        {"name": "b.weight", "shape": [per + 13], "dtype": "float32"},
        {"name": "c.weight", "shape": [2 * per + 7], "dtype": "bfloat16"},
        {"name": "d.bias", "shape": [5], "dtype": "float16"}],
        "initRules": [{"pattern": "*", "init": {"uniform": {"a": -1, "b": 1}}}],
        "seed": "11"}}


def check_fetch_staging(ctx, figures):
    """A fetch of a CUDA arena (device -> pinned staging -> stream): the
    file's digest in the last chunk matches its bytes, every tensor's bytes
    match Describe's digest, and the file equals the same model's file from
    a CPU arena. Pinned mappings of the server are sampled mid-stream."""
    mib = 16 if ctx.quick else 512
    a, b = ctx.server("a"), ctx.server("b")
    req = staging_model(mib)
    req["placement"] = {"device": ctx.devices["a_gpu"]}
    handle = materialize(a, req).handle
    try:
        info = a.describe(handle, CLIENT)
        before = pinned_mapping_bytes(a.pid)
        stream = a.stub.FetchWeights(
            a.pb.FetchRequest(handle=handle),
            metadata=a.md(CLIENT), timeout=300)
        parts, pos, total, digest, during = [], 0, None, "", None
        start = time.monotonic()
        for chunk in stream:
            if total is None:
                total = chunk.total_bytes
                during = pinned_mapping_bytes(a.pid)
            expect(chunk.offset == pos, f"chunk at {chunk.offset}, expected {pos}")
            parts.append(chunk.data)
            pos += len(chunk.data)
            digest = chunk.digest or digest
        seconds = time.monotonic() - start
        blob = b"".join(parts)
        expect(pos == total, f"stream ended at {pos} of {total}")
        figures["bytes"] = total
        figures["python_gbps"] = round(total / seconds / 1e9, 3)
        if before is not None and during is not None:
            figures["pinned_mapping_growth_mib"] = round((during - before) / MIB, 1)
        expect(digest, "no digest in the last chunk")
        expect(digest_of(blob) == digest, "the file's bytes do not match its digest")
        by_name = tensors_of_file(blob)
        for t in info.tensors:
            expect(digest_of(by_name[t.name]) == t.digest,
                   f"{t.name}: fetched bytes do not match Describe's digest")
    finally:
        release_all(a)
    cpu_req = staging_model(mib)
    cpu_req["placement"] = {"device": ctx.devices["b_cpu"]}
    cpu = materialize(b, cpu_req)
    try:
        cpu_blob, cpu_digest = fetch_file(b, cpu.handle)
    finally:
        b.release(cpu.handle, CLIENT)
    expect(cpu_digest == digest and cpu_blob == blob,
           "the CPU arena's file differs from the CUDA arena's")
    figures["file_digest"] = digest
    a.assert_idle(CLIENT)
    return PASS, ("digest verified; equals the CPU arena's file" if ctx.gpu else
                  "rehearsal: a CPU arena (no pinned staging without a GPU)")


def wait_line(proc, prefix, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line.split()
        if not line and proc.poll() is not None:
            fail(f"client exited: {proc.stderr.read()[-800:]}")
    fail(f"no {prefix!r} line within {timeout} s")


def check_sigkill_cleanup(ctx, figures):
    """A client holding handles on the GPU in a session is SIGKILLed: the
    ledger and the driver's used memory are back to the start figure within
    grace + 1 s (rehearsing: the server's resident memory)."""
    srv = ctx.server("a")
    each = (16 if ctx.quick else 256) * MIB
    victim = "gpu-run-victim"
    probe = MemoryProbe(ctx, srv.pid)
    figures["memory_source"] = probe.source
    # Warm-up: the same kind of model once, so that kernels the first
    # materialization loads (lazily, into device memory) are not counted.
    warm = {"model": {"tensors": [{"name": "w.0", "shape": [each // 4],
                                   "dtype": "float32"}],
                      "initRules": [{"pattern": "*", "init": {"normal": {"std": 0.02}}}],
                      "rng": "RNG_MODE_TORCH"}}
    srv.release(materialize(srv, warm, victim).handle, victim)
    time.sleep(0.3)
    start_figure = min(probe.used() for _ in range(3))
    figures["start_mib"] = round(start_figure / MIB, 1)
    proc = subprocess.Popen(
        [sys.executable, str(ctx.repo / "tests" / "python" / "session_client.py"),
         srv.address, victim, "hold", "3", str(each)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ctx.child_env())
    try:
        handles = wait_line(proc, "ready", timeout=max(5, ctx.left() - 20))[1:]
        held = probe.used()
        figures["held_mib"] = round((held - start_figure) / MIB, 1)
        figures["server_process_mib"] = (probe.process_used() or 0) >> 20
        expect(len(handles) == 3, f"client reported {handles}")
        expect(held - start_figure >= 0.9 * 3 * each,
               f"holding 3 x {each >> 20} MiB raised used memory by only "
               f"{(held - start_figure) / MIB:.1f} MiB ({probe.source})")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = time.monotonic()
    ledger_s = memory_s = None
    limit = ctx.grace_s + 1.0
    last = None
    while time.monotonic() - killed < limit + 4:
        elapsed = time.monotonic() - killed
        if ledger_s is None and srv.client_usage(victim) == (0, 0):
            ledger_s = elapsed
        last = probe.used()
        if memory_s is None and last <= start_figure + probe.tolerance():
            memory_s = elapsed
        if ledger_s is not None and memory_s is not None:
            break
        time.sleep(0.02)
    figures["grace_s"] = ctx.grace_s
    figures["ledger_zero_s"] = None if ledger_s is None else round(ledger_s, 3)
    figures["memory_back_s"] = None if memory_s is None else round(memory_s, 3)
    figures["end_mib"] = round(last / MIB, 1)
    figures["end_minus_start_mib"] = round((last - start_figure) / MIB, 2)
    expect(ledger_s is not None and ledger_s <= limit,
           f"the ledger still counted the client {limit} s after SIGKILL")
    expect(memory_s is not None and memory_s <= limit,
           f"{probe.source} used memory {last / MIB:.1f} MiB, start figure "
           f"{start_figure / MIB:.1f} MiB, {limit} s after SIGKILL")
    import grpc
    for h in handles:
        try:
            srv.describe(h, victim)
            fail(f"{h} still exists")
        except grpc.RpcError as e:
            expect(e.code() == grpc.StatusCode.NOT_FOUND, f"{h}: {e.code()}")
    return PASS, f"memory from {probe.source}"


def split_model(layers, mib_per_layer):
    n = mib_per_layer * MIB // 4 // 2
    tensors = [{"name": "embed.weight", "shape": [4 * MIB // 4], "dtype": "float32"}]
    for i in range(layers):
        tensors += [{"name": f"layers.{i}.attn.weight", "shape": [n], "dtype": "float32"},
                    {"name": f"layers.{i}.mlp.weight", "shape": [n], "dtype": "bfloat16"}]
    tensors.append({"name": "head.weight", "shape": [4 * MIB // 4],
                    "dtype": "float32", "tieTo": "embed.weight"})
    return {"model": {"tensors": tensors, "seed": "5",
                      "initRules": [{"pattern": "*", "init": {"normal": {"std": 0.02}}}]}}


def check_split_gpu_cpu(ctx, figures):
    """placement split over the GPU (capped) and the CPU: Plan and Describe
    agree on every tensor's device, both devices hold part of the handle,
    the fetched file equals the same model on the CPU alone, and release
    returns both devices' counters to zero."""
    srv = ctx.server("b")
    gpu, cpu = ctx.devices["b_gpu"], ctx.devices["b_cpu"]
    layers, per = (6, 4) if ctx.quick else (8, 64)
    cap = 4 + per * layers // 2  # about half the layers on the GPU
    req = split_model(layers, per)
    req["placement"] = {"device": "split", "split": {
        "devices": [gpu, cpu], "maxMemory": {gpu: f"{cap}MiB"},
        "noSplit": ["layers.2", "layers.3"]}}
    plan = srv.stub.Plan(srv.parse_request(json.dumps(req), srv.pb.PlanRequest),
                         metadata=srv.md(CLIENT), timeout=60)
    resp = materialize(srv, req)
    try:
        info = srv.describe(resp.handle, CLIENT)
        on = {t.name: t.device for t in info.tensors}
        figures["placement"] = resp.device
        figures["tensors_on_gpu"] = sum(d == gpu for d in on.values())
        figures["tensors_on_cpu"] = sum(d == cpu for d in on.values())
        expect(on == {t.name: t.device for t in plan.tensors},
               "Describe and Plan disagree on devices")
        expect(figures["tensors_on_gpu"] and figures["tensors_on_cpu"],
               f"not split across both devices: {resp.device}")
        expect(on["layers.2.attn.weight"] == on["layers.3.mlp.weight"],
               "a no_split group was cut")
        expect(on["head.weight"] == on["embed.weight"], "a tie left its root")
        usage = {d.device: d.in_use_bytes for d in srv.stats(CLIENT).devices}
        figures["gpu_mib"] = round(usage.get(gpu, 0) / MIB, 1)
        figures["cpu_mib"] = round(usage.get(cpu, 0) / MIB, 1)
        expect(0 < usage.get(gpu, 0) <= cap * MIB, f"GPU usage {usage}")
        expect(usage.get(cpu, 0) > 0, f"CPU usage {usage}")
        split_blob, split_digest = fetch_file(srv, resp.handle)
    finally:
        srv.release(resp.handle, CLIENT)
    whole_req = split_model(layers, per)
    whole_req["placement"] = {"device": cpu}
    whole = materialize(srv, whole_req)
    try:
        whole_blob, whole_digest = fetch_file(srv, whole.handle)
    finally:
        srv.release(whole.handle, CLIENT)
    expect(split_digest == whole_digest and split_blob == whole_blob,
           "the split handle's file differs from the same model on the CPU")
    srv.assert_idle(CLIENT)
    figures["file_mib"] = round(len(split_blob) / MIB, 1)
    return PASS, f"{gpu} (max {cap} MiB) + {cpu}"


CHECKS = {
    "server_auto": check_server_auto,
    "gpu_tests_cpp": check_gpu_tests_cpp,
    "gpu_tests_python": check_gpu_tests_python,
    "portable_random": check_portable_random,
    "portable_server": check_portable_server,
    "torch_mode_cuda": check_torch_mode_cuda,
    "ipc_export": check_ipc_export,
    "fetch_staging": check_fetch_staging,
    "sigkill_cleanup": check_sigkill_cleanup,
    "split_gpu_cpu": check_split_gpu_cpu,
}


def run_check(name, ctx):
    if name.startswith("bench_"):
        import gpu_bench
        fn = gpu_bench.BENCHES[name]
    else:
        fn = CHECKS[name]
    figures = {}
    try:
        status, detail = fn(ctx, figures)
    except Outcome as o:
        status, detail = o.status, o.detail
    except Exception as error:  # noqa: BLE001 - any failure is the check's
        traceback.print_exc()
        status = FAIL
        detail = f"{type(error).__name__}: {error}"[:2000]
    finally:
        for srv in ctx._servers.values():
            if srv.channel is not None:
                srv.channel.close()
    return {"status": status, "figures": figures, "detail": detail}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="probe, or a check (tools/gpu_run.py STEPS)")
    ap.add_argument("--context")
    ap.add_argument("--result")
    args = ap.parse_args(argv)
    if args.name == "probe":
        probe()
        return 0
    ctx = Context(json.loads(pathlib.Path(args.context).read_text()))
    result = run_check(args.name, ctx)
    pathlib.Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
