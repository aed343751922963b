#!/usr/bin/env python3
"""The prepared GPU machine run: one command that tests and benchmarks every
CUDA path of materializerd on a machine with a GPU, within a time budget,
and writes its results as it goes.

    tools/gpu-run CARRY [--out DIR] [--budget SECONDS] [--only a,b]
    tools/gpu-run CARRY --rehearse-cpu [--quick]      # here, without a GPU

CARRY is the folder `./dev gpu-carry` builds (tools/gpu_carry.py): the
binaries with their non-torch libraries, the generated Python messages and
a fallback protobuf runtime. LibTorch is the machine's own torch (the same
version the carry was built against), linked into a scratch copy of the
bundle. Runs from the repository root of a checkout (the tests, examples
and Python client come from there).

What it does, in order, each step time-boxed in a child process of its own
(tools/gpu_checks.py, bench/gpu_bench.py) and recorded PASS, FAIL or SKIP
with its figures:

  environment        torch, CUDA, driver, the carry's libraries resolve
  server_auto        materializerd --devices=auto on 127.0.0.1 serves the GPU
  gpu_tests_cpp      the carried C++ tests tagged requires-gpu
  gpu_tests_python   the Python tests marked requires-gpu (docstring)
  portable_random    the portable CUDA kernel == the CPU, random cases
  portable_server    portable handles on the GPU == on the CPU == NumPy
  torch_mode_cuda    torch mode on the GPU == torch.nn.init with CUDA generators
  ipc_export         a CUDA IPC export read by a second process
  fetch_staging      fetch from a CUDA arena (pinned staging), digests checked
  sigkill_cleanup    SIGKILL of a client holding GPU handles: driver memory back
  split_gpu_cpu      placement split across the GPU and the CPU
  bench_init         portable init bandwidth vs torch normal_/uniform_ vs cudaMemset
  bench_materialize  llama-1b Materialize vs in-process to_empty(cuda) + init
  bench_fetch        fetch throughput from a CUDA arena vs a CPU arena
  server_shutdown    both servers exit cleanly on SIGTERM

--rehearse-cpu runs the same steps against the CPU (server devices cpu and
cpu:2, CPU generators, a shared-memory export, two CPU kernel paths), so
only the GPU parts can fail on the GPU machine; GPU-only parts are SKIP.
Results: $OUT (or --out) gets gpu-run.json, gpu-run.md, gpu-run.log,
servers.log and nvidia-smi.txt (at most 8 files come back from a run).
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

# (name, title, seconds allowed in a full run, in a quick run)
STEPS = [
    ("environment", "torch, CUDA and the carry's libraries", 120, 120),
    ("server_auto", "materializerd --devices=auto serves the GPU", 60, 40),
    ("gpu_tests_cpp", "C++ tests tagged requires-gpu", 120, 60),
    ("gpu_tests_python", "Python tests marked requires-gpu", 120, 90),
    ("portable_random", "portable CUDA kernel == CPU, random cases", 90, 40),
    ("portable_server", "portable handles on the GPU == CPU == NumPy", 90, 60),
    ("torch_mode_cuda", "torch mode on the GPU == torch.nn.init (CUDA generators)", 120, 90),
    ("ipc_export", "CUDA IPC export read by a second process", 90, 60),
    ("fetch_staging", "fetch from a CUDA arena through pinned staging", 90, 40),
    ("sigkill_cleanup", "SIGKILL of a client holding GPU handles", 60, 40),
    ("split_gpu_cpu", "placement split across the GPU and the CPU", 90, 40),
    ("bench_init", "portable init bandwidth vs torch vs cudaMemset", 90, 60),
    ("bench_materialize", "Materialize llama-1b vs in-process to_empty(cuda)", 150, 60),
    ("bench_fetch", "fetch throughput from a CUDA arena", 120, 40),
    ("server_shutdown", "servers exit cleanly on SIGTERM", 40, 30),
]
# Kept back from the budget for the shutdown step and the last writes.
RESERVE_S = 25
# A step is not started with less than this left (it is SKIP instead).
MIN_STEP_S = 10
LOG_TAIL_BYTES = 200_000


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


class Log:
    """gpu-run.log: progress lines (also on stderr) and each step's output."""

    def __init__(self, path):
        self.path = path
        self.file = open(path, "a", encoding="utf-8")
        self.start = time.monotonic()

    def line(self, text):
        stamp = f"[{time.monotonic() - self.start:7.1f}s]"
        for part in text.rstrip("\n").split("\n"):
            print(f"{stamp} {part}", file=sys.stderr, flush=True)
            self.file.write(f"{stamp} {part}\n")
        self.file.flush()

    def block(self, title, text):
        if len(text) > LOG_TAIL_BYTES:
            text = f"[... {len(text) - LOG_TAIL_BYTES} bytes left out ...]\n" + \
                text[-LOG_TAIL_BYTES:]
        self.file.write(f"----- {title} -----\n{text.rstrip()}\n----- end -----\n")
        self.file.flush()


class Results:
    """gpu-run.json and gpu-run.md, rewritten after every step, so a run cut
    short still leaves what it measured."""

    def __init__(self, out, header):
        self.out = out
        self.data = dict(header, checks=[], finished=False)

    def add(self, check):
        self.data["checks"].append(check)
        self.write()

    def write(self, finished=False):
        self.data["finished"] = finished
        self.data["elapsed_s"] = round(time.monotonic() - self.data["_t0"], 1)
        counts = {PASS: 0, FAIL: 0, SKIP: 0}
        for c in self.data["checks"]:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        self.data["summary"] = counts
        public = {k: v for k, v in self.data.items() if not k.startswith("_")}
        atomic_write(self.out / "gpu-run.json", json.dumps(public, indent=1) + "\n")
        atomic_write(self.out / "gpu-run.md", markdown(public))


def atomic_write(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def short_figures(figures, limit=160):
    parts = []
    for k, v in figures.items():
        if isinstance(v, (dict, list)):
            continue
        if isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def markdown(data):
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_bench  # noqa: E402  (tables of the benchmark steps)
    s = data.get("summary", {})
    lines = [
        f"# GPU run ({data['mode']}{', quick' if data.get('quick') else ''})",
        "",
        f"- command: `{data['command']}`",
        f"- started: {data['started']}; elapsed {data.get('elapsed_s', 0)} s "
        f"of a {data['budget_s']} s budget; "
        f"{'finished' if data.get('finished') else 'NOT finished (cut short?)'}",
        f"- result: {s.get(PASS, 0)} PASS, {s.get(FAIL, 0)} FAIL, "
        f"{s.get(SKIP, 0)} SKIP",
    ]
    env = next((c for c in data["checks"] if c["name"] == "environment"), None)
    if env:
        f = env.get("figures", {})
        lines.append(f"- machine: {f.get('gpu', 'no GPU')}; driver "
                     f"{f.get('driver', '-')}; torch {f.get('torch', '-')} "
                     f"(CUDA {f.get('torch_cuda', '-')}); Python "
                     f"{f.get('python', '-')}; carry {f.get('carry_commit', '-')}")
    lines += ["", "| check | status | seconds | figures | detail |",
              "|---|---|---:|---|---|"]
    for c in data["checks"]:
        detail = c.get("detail", "").replace("|", "\\|").replace("\n", " ")
        if len(detail) > 300:
            detail = detail[:297] + "..."
        lines.append(f"| {c['name']} | {c['status']} | {c['seconds']:.1f} | "
                     f"{short_figures(c.get('figures', {})).replace('|', '/')} "
                     f"| {detail} |")
    for c in data["checks"]:
        try:
            table = gpu_bench.markdown_for(c)
        except Exception as error:  # noqa: BLE001 - the JSON has the figures
            table = f"(no table: {type(error).__name__}: {error})"
        if table:
            lines += ["", f"## {c['name']}: {c['title']}", "", table]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------

class ServerProcess:
    """A materializerd started by this run, its stderr in a file."""

    LISTEN_RE = re.compile(r"^materializerd listening on (\S+)\s*$")

    def __init__(self, name, binary, args, scratch, log):
        self.name, self.binary, self.args = name, binary, list(args)
        self.log_path = scratch / f"materializerd-{name}.log"
        self.log = log
        self.proc = None
        self.address = None
        self.restarts = 0

    def start(self, timeout):
        cmd = [str(self.binary), "--listen=127.0.0.1:0", *self.args]
        self.log.line(f"server {self.name}: {' '.join(cmd)}")
        err = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                     stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        err.close()
        found = {}

        def read():
            for raw in iter(self.proc.stdout.readline, b""):
                m = self.LISTEN_RE.match(raw.decode("utf-8", "replace"))
                if m and "address" not in found:
                    found["address"] = m.group(1)
            found["eof"] = True

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and "address" not in found:
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if "address" not in found:
            rc = self.proc.poll()
            if rc is None:
                self.kill()
            raise RuntimeError(
                f"server {self.name} did not listen within {timeout:.0f} s "
                f"(rc {rc}); stderr tail: {self.tail(1500)}")
        self.address = found["address"]
        self.log.line(f"server {self.name}: listening on {self.address} "
                      f"(pid {self.proc.pid})")
        return self.address

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n):
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout):
        """SIGTERM; the exit status, or None if it had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------

class Run:
    def __init__(self, args):
        self.args = args
        self.gpu = not args.rehearse_cpu
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget
        self.out = pathlib.Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("gpu-run.json", "gpu-run.md", "gpu-run.log",
                     "servers.log", "nvidia-smi.txt"):
            (self.out / name).unlink(missing_ok=True)
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="materializer-gpu-run-"))
        self.log = Log(self.out / "gpu-run.log")
        self.carry = pathlib.Path(args.carry).resolve()
        self.servers = {}
        self.env = dict(os.environ)
        self.runtime = None
        self.manifest = {}
        command = "tools/gpu-run " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        self.results = Results(self.out, {
            "_t0": self.t0, "tool": "tools/gpu-run", "command": command,
            "mode": "gpu" if self.gpu else "rehearse-cpu", "quick": args.quick,
            "started": now_utc(), "budget_s": args.budget,
            "host": platform.node(), "repo_commit": git_commit()})
        self.only = set(args.only.split(",")) if args.only else None

    # -- device names ------------------------------------------------------
    def devices(self):
        if self.gpu:
            return {"a": "auto", "a_gpu": "cuda:0", "b": "cuda:0,cpu",
                    "b_gpu": "cuda:0", "b_cpu": "cpu"}
        return {"a": "auto", "a_gpu": "cpu", "b": "cpu:2",
                "b_gpu": "cpu:0", "b_cpu": "cpu:1"}

    def remaining(self):
        return self.deadline - time.monotonic()

    # -- steps ---------------------------------------------------------------
    def record(self, name, title, status, seconds, figures=None, detail=""):
        check = {"name": name, "title": title, "status": status,
                 "seconds": round(seconds, 2), "figures": figures or {},
                 "detail": detail}
        self.results.add(check)
        self.log.line(f"{status} {name} ({seconds:.1f} s): "
                      f"{short_figures(figures or {})} {detail[:400]}")
        return check

    def context(self, budget):
        return {
            "mode": "gpu" if self.gpu else "rehearse-cpu",
            "quick": self.args.quick,
            "repo": str(REPO),
            "carry": str(self.carry),
            "bin": str(self.runtime / "bin") if self.runtime else None,
            "tests": str(self.runtime / "tests") if self.runtime else None,
            "proto": str(self.carry / "proto"),
            "manifest": self.manifest,
            "servers": {k: {"address": s.address, "pid": s.proc.pid,
                            "devices": s.args}
                        for k, s in self.servers.items() if s.alive()},
            "devices": self.devices(),
            "grace_s": 1.0,
            "scratch": str(self.scratch),
            "out": str(self.out),
            "budget_s": budget,
            "llama_model": self.args.llama_model,
        }

    def child(self, name, title, timeout, module):
        """Runs one check in a child process; its result file, or FAIL."""
        ctx_path = self.scratch / f"{name}.context.json"
        res_path = self.scratch / f"{name}.result.json"
        out_path = self.scratch / f"{name}.output.txt"
        ctx_path.write_text(json.dumps(self.context(timeout)))
        res_path.unlink(missing_ok=True)
        start = time.monotonic()
        with open(out_path, "wb") as output:
            proc = subprocess.Popen(
                [sys.executable, str(module), name, "--context", str(ctx_path),
                 "--result", str(res_path)],
                stdout=output, stderr=subprocess.STDOUT, cwd=str(REPO),
                env=self.env, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc, timed_out = None, True
        seconds = time.monotonic() - start
        text = out_path.read_text("utf-8", "replace")
        self.log.block(f"{name} output (rc {rc})", text)
        result = {}
        if res_path.exists():
            try:
                result = json.loads(res_path.read_text())
            except ValueError:
                result = {}
        if timed_out:
            detail = (f"timed out after {timeout:.0f} s; last output: "
                      f"{text[-600:]}")
            return self.record(name, title, FAIL, seconds,
                               result.get("figures"), detail)
        if not result:
            return self.record(name, title, FAIL, seconds, {},
                               f"the check exited with {rc} without a result; "
                               f"output tail: {text[-800:]}")
        return self.record(name, title, result["status"], seconds,
                           result.get("figures"), result.get("detail", ""))

    def ensure_server(self, key, extra):
        """Starts (or restarts, once) server `key`; None, or why it is not
        available."""
        s = self.servers.get(key)
        if s is not None and s.alive():
            return None
        if s is not None:
            if s.restarts >= 1:
                return f"server {key} died again (rc {s.proc.returncode})"
            self.log.line(f"server {key} died (rc {s.proc.returncode}); "
                          f"restarting. stderr tail: {s.tail(1500)}")
            s.restarts += 1
        else:
            s = ServerProcess(key, self.runtime / "bin" / "materializerd",
                              extra, self.scratch, self.log)
            self.servers[key] = s
        try:
            s.start(timeout=min(90, max(5, self.remaining() - RESERVE_S)))
        except RuntimeError as error:
            return str(error)
        return None

    def server_args(self, key):
        d = self.devices()
        if key == "a":
            return [f"--devices={d['a']}", "--session_grace=1s",
                    "--log_level=info", "--cpu_capacity=8GiB"]
        return [f"--devices={d['b']}", "--session_grace=1s",
                "--log_level=info",
                "--cpu_capacity=16GiB" if self.gpu else "--cpu_capacity=4GiB"]

    def main(self):
        self.log.line(f"GPU run ({'gpu' if self.gpu else 'rehearse-cpu'}"
                      f"{', quick' if self.args.quick else ''}): carry "
                      f"{self.carry}, out {self.out}, budget {self.args.budget} s")
        self.snapshot_nvidia_smi("start")
        checks_py = HERE / "gpu_checks.py"
        completed = False  # every step ran (not stopped by a signal)
        try:
            for name, title, full_s, quick_s in STEPS:
                allowed = quick_s if self.args.quick else full_s
                if name == "server_shutdown":
                    self.shutdown(name, title)
                    continue
                if self.only is not None and name not in self.only and \
                        name not in ("environment", "server_auto"):
                    continue
                left = self.remaining() - RESERVE_S
                if left < MIN_STEP_S:
                    self.record(name, title, SKIP, 0, {},
                                f"not started: {left + RESERVE_S:.0f} s of the "
                                f"budget left")
                    continue
                timeout = min(allowed, left)
                if name == "environment":
                    self.environment(name, title, timeout)
                    if self.runtime is None:
                        break
                    continue
                needs = "b" if name in ("portable_server", "ipc_export",
                                        "fetch_staging", "split_gpu_cpu",
                                        "bench_fetch") else None
                why = self.ensure_server("a", self.server_args("a"))
                if why is None and needs:
                    why = self.ensure_server("b", self.server_args("b"))
                if why is not None:
                    self.record(name, title, FAIL, 0, {}, why)
                    continue
                timeout = min(allowed, self.remaining() - RESERVE_S)
                self.child(name, title, timeout, checks_py)
            completed = True
        finally:
            if not any(c["name"] == "server_shutdown"
                       for c in self.results.data["checks"]):
                self.shutdown("server_shutdown", STEPS[-1][1])
            self.snapshot_nvidia_smi("end")
            self.results.write(finished=completed)
            shutil.rmtree(self.scratch, ignore_errors=True)
        s = self.results.data["summary"]
        self.log.line(f"done: {s[PASS]} PASS, {s[FAIL]} FAIL, {s[SKIP]} SKIP "
                      f"in {time.monotonic() - self.t0:.0f} s; results in "
                      f"{self.out / 'gpu-run.json'}")
        return 1 if s[FAIL] else 0

    # -- environment -----------------------------------------------------------
    def environment(self, name, title, timeout):
        """Probes the Python side (a child, as it imports torch), prepares a
        runnable copy of the bundle with the machine's torch linked in, and
        checks the carry's libraries resolve."""
        start = time.monotonic()
        figures, problems = {}, []
        manifest_path = self.carry / "MANIFEST.json"
        if not manifest_path.exists():
            self.record(name, title, FAIL, time.monotonic() - start, {},
                        f"{manifest_path} not found: build the carry with "
                        "./dev gpu-carry and pass its folder")
            return
        self.manifest = json.loads(manifest_path.read_text())
        figures["carry_commit"] = self.manifest.get("commit")
        figures["carry_mib"] = round(self.manifest.get("bytes", 0) / 2**20, 1)
        figures["cuda_kernels"] = self.manifest.get("cuda_kernels")
        if self.gpu and not self.manifest.get("cuda_kernels_compiled"):
            problems.append("the carry's CUDA kernels were not compiled "
                            f"({self.manifest.get('cuda_kernels')})")
        try:
            probe = subprocess.run(
                [sys.executable, str(HERE / "gpu_checks.py"), "probe"],
                capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
        except subprocess.TimeoutExpired:
            self.record(name, title, FAIL, time.monotonic() - start, figures,
                        f"probing torch took over {timeout:.0f} s")
            return
        self.log.block("probe", probe.stdout + probe.stderr)
        try:
            info = json.loads(probe.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.record(name, title, FAIL, time.monotonic() - start, figures,
                        f"probe failed (rc {probe.returncode}): "
                        f"{probe.stderr[-800:]}")
            return
        figures.update({k: v for k, v in info.items() if k != "torch_dir"})
        if self.gpu and not info.get("cuda_devices"):
            problems.append("torch sees no CUDA device")
        want = self.manifest.get("torch")
        if want and info.get("torch") != want:
            problems.append(f"the machine's torch is {info.get('torch')}, the "
                            f"carry was built against {want} (C++ ABI)")

        # A runnable bundle: the carry's, with the machine's torch as lib/torch.
        runtime = self.scratch / "bundle"
        shutil.copytree(self.carry / "bundle", runtime, symlinks=True)
        (runtime / "lib" / "torch").unlink(missing_ok=True)
        os.symlink(info["torch_dir"], runtime / "lib" / "torch")
        unresolved = {}
        for folder in ("bin", "tests"):
            for binary in sorted((runtime / folder).glob("*")):
                out = subprocess.run(["ldd", str(binary)], capture_output=True,
                                     text=True).stdout
                missing = [line.split()[0] for line in out.splitlines()
                           if "not found" in line
                           and not line.split()[0].startswith("libcuda.so")]
                if missing:
                    unresolved[binary.name] = missing
        if unresolved:
            problems.append(f"unresolved libraries: {unresolved}")
        # It loads (every library, LibTorch included) and prints its usage
        # (absl's --help exits with 1).
        help_out = subprocess.run([str(runtime / "bin" / "materializerd"), "--help"],
                                  capture_output=True, text=True)
        if "Usage: materializerd" not in help_out.stdout + help_out.stderr:
            problems.append(f"materializerd --help failed ({help_out.returncode}): "
                            f"{help_out.stderr[-400:]}")

        # Generated messages: with the machine's protobuf, else the carried one.
        check = ("import sys; sys.path.insert(0, sys.argv[1]); import grpc; "
                 "from materializer.v1 import materializer_pb2, "
                 "materializer_pb2_grpc; materializer_pb2.MaterializeRequest()")
        ok = subprocess.run([sys.executable, "-c", check, str(self.carry / "proto")],
                            capture_output=True, text=True)
        figures["protobuf_runtime"] = "machine's own"
        if ok.returncode != 0:
            fallback = str(self.carry / "python")
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (fallback, os.environ.get("PYTHONPATH")) if p)
            again = subprocess.run(
                [sys.executable, "-c", check, str(self.carry / "proto")],
                capture_output=True, text=True, env=self.env)
            figures["protobuf_runtime"] = (
                f"carried {self.manifest.get('python_fallback', {}).get('protobuf')}")
            if again.returncode != 0:
                problems.append("the generated messages do not load: "
                                f"{again.stderr[-600:]}")
        self.runtime = runtime
        status = FAIL if problems else PASS
        self.record(name, title, status, time.monotonic() - start, figures,
                    "; ".join(problems))
        if problems and any("unresolved" in p or "do not load" in p or
                            "--help failed" in p for p in problems):
            self.runtime = None  # nothing else can run

    def snapshot_nvidia_smi(self, when):
        smi = shutil.which("nvidia-smi")
        if smi is None:
            if when == "start":
                (self.out / "nvidia-smi.txt").write_text("nvidia-smi: not found\n")
            return
        try:
            out = subprocess.run([smi], capture_output=True, text=True,
                                 timeout=30).stdout
        except (subprocess.TimeoutExpired, OSError) as error:
            out = f"nvidia-smi: {error}\n"
        with open(self.out / "nvidia-smi.txt", "a", encoding="utf-8") as f:
            f.write(f"===== {when} ({now_utc()}) =====\n{out}\n")

    def shutdown(self, name, title):
        start = time.monotonic()
        codes, problems = {}, []
        for key, s in self.servers.items():
            if s.proc is not None and s.proc.poll() is not None:
                problems.append(f"server {key} had already exited "
                                f"(rc {s.proc.returncode})")
            elif s.proc is not None:
                s.proc.send_signal(signal.SIGTERM)  # all at once; waited below
        for key, s in self.servers.items():
            rc = s.stop(timeout=20)
            codes[key] = rc
            if rc is None:
                problems.append(f"server {key} did not exit within 20 s of "
                                "SIGTERM (killed)")
            elif rc != 0:
                problems.append(f"server {key} exited with {rc}")
            if s.restarts:
                problems.append(f"server {key} was restarted {s.restarts} time(s)")
        with open(self.out / "servers.log", "w", encoding="utf-8") as f:
            for key, s in self.servers.items():
                f.write(f"===== server {key}: {s.binary} {' '.join(s.args)} =====\n")
                f.write(s.tail(4 << 20))
                f.write("\n")
        if not self.servers:
            self.record(name, title, SKIP, time.monotonic() - start, {},
                        "no server was started")
            return
        self.record(name, title, FAIL if problems else PASS,
                    time.monotonic() - start,
                    {f"rc_{k}": v for k, v in codes.items()}, "; ".join(problems))


def git_commit():
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12",
                              "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("carry", help="the carry folder (./dev gpu-carry)")
    ap.add_argument("--out", default=os.environ.get("OUT") or
                    str(REPO / ".build" / "gpu-run"),
                    help="results folder (default $OUT, else .build/gpu-run)")
    ap.add_argument("--budget", type=float, default=450,
                    help="seconds for the whole run (default 450)")
    ap.add_argument("--rehearse-cpu", action="store_true",
                    help="run against the CPU (no GPU needed)")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes and few cases (the rehearsal test)")
    ap.add_argument("--only", default="",
                    help="comma list of steps to run (environment and "
                    "server_auto always run)")
    ap.add_argument("--llama-model", default=None,
                    help="example for bench_materialize (default llama-1b; "
                    "mlp with --quick)")
    args = ap.parse_args(argv)
    if args.llama_model is None:
        args.llama_model = "mlp" if args.quick else "llama-1b"
    known = {s[0] for s in STEPS}
    if args.only and not set(args.only.split(",")) <= known:
        ap.error(f"--only: unknown steps {set(args.only.split(',')) - known}")
    run = Run(args)

    def on_signal(signum, frame):
        run.log.line(f"signal {signum}: stopping")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return run.main()
    finally:
        for s in run.servers.values():
            s.kill()


if __name__ == "__main__":
    sys.exit(main())
