"""The prepared GPU machine run (tools/gpu-run), rehearsed on the CPU, so it
cannot rot between GPU runs: a carry folder built from this build's
binaries (tools/gpu_carry.py, as `./dev gpu-carry` does from its CUDA
build), then every step of the run with small sizes (--rehearse-cpu
--quick). Every step passes except those only a GPU can run, which say
SKIP; the results files are complete. The benchmark tables are checked
with GPU-shaped figures, which only a GPU run produces."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import serverproc

REPO = pathlib.Path(serverproc.REPO)
BAZEL_BIN = pathlib.Path(serverproc.SERVER_BIN).parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "bench"))

# Steps with nothing to run without a GPU (their CPU parts still run).
GPU_ONLY = {"gpu_tests_cpp", "gpu_tests_python", "bench_init",
            "bench_materialize", "bench_fetch"}


@pytest.fixture(scope="module")
def carry(tmp_path_factory):
    import gpu_carry
    out = tmp_path_factory.mktemp("gpu") / "carry"
    rc = gpu_carry.main(["--bazel-bin", str(BAZEL_BIN), "--out", str(out)])
    assert rc == 0, "tools/gpu_carry.py failed (its message is above)"
    return out


def test_carry_holds_what_a_gpu_machine_lacks(carry):
    manifest = json.loads((carry / "MANIFEST.json").read_text())
    assert "//server/init/portable:portable_cuda_test" in manifest["requires_gpu_tests"]
    for rel in [manifest["server"], manifest["matctl"], *manifest["tools"].values(),
                *manifest["requires_gpu_tests"].values()]:
        binary = carry / rel
        assert binary.is_file() and os.access(binary, os.X_OK), rel
        dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True,
                                 text=True, check=True).stdout
        # Libraries are found through the carry (DT_RPATH, which also
        # covers the system libraries' own dependencies), never through
        # this machine's paths.
        search = re.findall(r"\(RPATH\)\s+Library rpath: \[(.*)\]", dynamic)
        assert len(search) == 1 and "RUNPATH" not in dynamic, (rel, dynamic)
        entries = search[0].split(":")
        assert "$ORIGIN/../lib/system" in entries, (rel, entries)
        assert all(e.startswith("$ORIGIN/../lib/") for e in entries), (rel, entries)
    assert not (carry / "bundle" / "lib" / "torch").exists()  # the machine's own
    assert list((carry / "bundle" / "lib" / "system").glob("libgrpc++.so*"))
    assert (carry / "proto" / "materializer" / "v1" / "materializer_pb2.py").exists()
    assert (carry / "python" / "google" / "protobuf" / "__init__.py").exists()
    # It travels with the tracked files: 64 MiB in all.
    assert manifest["bytes"] < 60 << 20


def test_rehearsal_runs_every_step(carry, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ)
    env.pop("OUT", None)
    proc = subprocess.run(
        [str(REPO / "tools" / "gpu-run"), str(carry), "--rehearse-cpu", "--quick",
         "--out", str(out), "--budget", "420"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    log = (out / "gpu-run.log").read_text() if (out / "gpu-run.log").exists() else ""
    data = json.loads((out / "gpu-run.json").read_text())
    import gpu_run
    steps = [s[0] for s in gpu_run.STEPS]
    got = {c["name"]: c for c in data["checks"]}
    assert [c["name"] for c in data["checks"]] == steps, log[-4000:]
    problems = []
    for name in steps:
        want = "SKIP" if name in GPU_ONLY else "PASS"
        if got[name]["status"] != want:
            problems.append(f"{name}: {got[name]['status']} ({got[name]['detail']})")
    assert not problems, "\n".join(problems) + "\n" + proc.stderr[-4000:]
    assert proc.returncode == 0
    assert data["finished"] and data["mode"] == "rehearse-cpu"
    assert data["summary"] == {"PASS": len(steps) - len(GPU_ONLY), "FAIL": 0,
                               "SKIP": len(GPU_ONLY)}
    # What the CPU parts measured.
    assert got["portable_random"]["figures"]["mismatches"] == 0
    assert got["portable_random"]["figures"]["cases"] >= 50
    assert got["portable_server"]["figures"]["reference_checked"] > 0
    assert got["sigkill_cleanup"]["figures"]["memory_back_s"] <= 2.0
    assert got["split_gpu_cpu"]["figures"]["tensors_on_gpu"] > 0
    assert got["bench_materialize"]["figures"]["rows"]["in_process"]["median_s"] > 0
    md = (out / "gpu-run.md").read_text()
    for name in steps:
        assert f"| {name} |" in md
    assert (out / "servers.log").stat().st_size > 0


def gpu_shaped_run():
    """What a GPU run's gpu-run.json holds (figures invented for the
    formatting test only; nothing here is a measurement)."""
    cases = {f"{d}/{t}": {"portable_gbps": 3000.0, "torch_gbps": 1000.0,
                          "vs_memset": 0.75, "vs_torch": 3.0}
             for d in ("normal", "uniform") for t in ("float32", "bfloat16")}
    return {
        "mode": "gpu", "command": "tools/gpu-run .build/gpu-carry",
        "started": "2000-01-01 00:00:00 UTC",
        "summary": {"PASS": 15, "FAIL": 0, "SKIP": 0},
        "checks": [
            {"name": "environment", "status": "PASS",
             "figures": {"gpu": "GPU-X", "gpu_mib": 1, "driver": "1.0",
                         "torch": "t", "torch_cuda": "c", "python": "p",
                         "cpus": 1, "carry_commit": "abc", "cuda_kernels": "nvcc"}},
            {"name": "bench_init", "status": "PASS", "figures": {
                "bytes": 1 << 30, "reps": 10, "device": "GPU-X",
                "memset_gbps": 4000.0, "d2h_pinned_gbps": 50.0, "cases": cases,
                "goal_70pct_of_memset": "met", "goal_ahead_of_torch": "met"}},
            {"name": "bench_materialize", "status": "PASS", "figures": {
                "model": "llama-1b", "bytes": 4.4e9, "device": "cuda:0", "reps": 3,
                "rows": {k: {"median_s": 1.0, "min_s": 0.9, "max_s": 1.1,
                             "vs_in_process": 0.5, "server_total_s": 0.8,
                             "server_init_s": 0.1}
                         for k in ("service_portable", "service_torch")} |
                {"in_process": {"median_s": 2.0, "min_s": 1.9, "max_s": 2.1,
                                "vs_in_process": 1.0,
                                "phases_s": {"meta": 0.1, "to_empty": 0.1,
                                             "init": 1.8, "total": 2.0}}}}},
            {"name": "bench_fetch", "status": "PASS", "figures": {
                "bytes": 4 << 30, "same_digest": True, "cuda_vs_cpu": 0.9,
                "d2h_pinned_gbps": 50.0,
                "sources": {"cuda_arena": {"device": "cuda:0", "cold_gbps": 1.0,
                                           "warm_gbps": 2.0, "digest": "x"},
                            "cpu_arena": {"device": "cpu", "cold_gbps": 1.0,
                                          "warm_gbps": 2.2, "digest": "x"}}}},
        ]}


def test_gpu_tables_and_results_section(tmp_path, monkeypatch):
    import gpu_bench
    import run as bench_run
    data = gpu_shaped_run()
    tables = {c["name"]: gpu_bench.markdown_for(c) for c in data["checks"]}
    assert "| normal/float32 | 3000.0 | 1000.0 | 0.75 | **3.00x** |" in tables["bench_init"]
    assert "Goals: >= 70% of cudaMemset: met" in tables["bench_init"]
    assert "| service, RNG_MODE_PORTABLE | 1.000 (0.900-1.100)" in tables["bench_materialize"]
    assert "| cuda_arena (cuda:0) | 1.0 | 2.0 |" in tables["bench_fetch"]
    results = tmp_path / "RESULTS.md"
    results.write_text((REPO / "bench" / "RESULTS.md").read_text())
    monkeypatch.setattr(bench_run, "RESULTS", str(results))
    path = tmp_path / "gpu-run.json"
    path.write_text(json.dumps(data))
    gpu_bench.write_results(str(path))
    text = results.read_text()
    assert text.count("<!-- bench/gpu_bench.py: gpu -->") == 1
    assert "## GPU: GPU-X (tools/gpu-run)" in text
    assert "Not yet measured" not in text.split("<!-- bench/gpu_bench.py: gpu -->")[1]
    # A rehearsal's results are not GPU figures: refused.
    data["mode"] = "rehearse-cpu"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        gpu_bench.write_results(str(path))


def test_init_figures_ratios_and_goals():
    import gpu_bench
    gib = 1 << 30
    ours = {"cudaMemset": [0.25, 0.25, 0.30], "d2h_pinned": [0.02],
            "normal/float32": [0.40, 0.30, 0.50], "normal/bfloat16": [0.30],
            "uniform/float32": [0.30], "uniform/bfloat16": [0.30]}
    theirs = {k: [0.6] for k in ours if "/" in k}
    f = gpu_bench.init_figures(gib, ours, theirs)
    # Medians: memset 0.25 s -> 4.29 GB/s; normal/float32 0.40 s -> 2.68 GB/s.
    assert f["memset_gbps"] == round(gib / 0.25 / 1e9, 1)
    c = f["cases"]["normal/float32"]
    assert c["vs_memset"] == round(0.25 / 0.40, 3)
    assert c["vs_torch"] == round(0.6 / 0.40, 2)
    # normal/float32 is at 62.5% of memset: the 70% goal is not met.
    assert f["goal_70pct_of_memset"] == "NOT met"
    assert f["goal_ahead_of_torch"] == "met"
    ours["normal/float32"] = [0.30]
    assert gpu_bench.init_figures(gib, ours, theirs)["goal_70pct_of_memset"] == "met"


def test_a_new_results_section_leaves_other_sections_placeholders(tmp_path, monkeypatch):
    # The writer once dropped every "_Not yet measured" line of the file when
    # it appended a section of its own (the GPU section lost its text).
    import run as bench_run
    results = tmp_path / "RESULTS.md"
    results.write_text((REPO / "bench" / "RESULTS.md").read_text())
    before = results.read_text().split("<!-- bench/gpu_bench.py: gpu -->")[1]
    monkeypatch.setattr(bench_run, "RESULTS", str(results))
    bench_run.write_results("another-machine", "## Another machine\n\n| a |", mark="bench/x.py")
    text = results.read_text()
    assert "<!-- bench/x.py: another-machine -->\n## Another machine" in text
    assert text.split("<!-- bench/gpu_bench.py: gpu -->")[1].startswith(
        before.split("<!-- /bench/gpu_bench.py: gpu -->")[0])
