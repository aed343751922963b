"""Sessions and admission under load, in one run:

  1. cleanup latency: a client process attaches, materializes 3 handles in
     its session and is SIGKILLed; the time from the kill to the server's
     ledger for that client reaching zero (20 runs; p50 and max), next to the
     configured grace period;
  2. Materialize latency (p50, p99) and throughput for a 1 MiB module with
     1, 8 and 64 concurrent clients (each client: materialize, release, in a
     loop), as a ratio against the single-client p50 of the same run.

    .venv/bin/python bench/sessions.py [--runs 20] [--seconds 10] [--write]
"""

import argparse
import datetime
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

import serverproc  # noqa: E402

GRACE_S = 1.0
RESULTS = os.path.join(REPO, "bench", "RESULTS.md")
BEGIN = "<!-- bench/sessions.py -->"
END = "<!-- /bench/sessions.py -->"


def percentile(values, q):
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def cleanup_latency(srv, runs):
    env = dict(os.environ, MATERIALIZER_PY_PROTO=serverproc.PY_PROTO)
    client_py = os.path.join(REPO, "tests", "python", "session_client.py")
    out = []
    for run in range(runs):
        name = f"bench-victim-{run}"
        proc = subprocess.Popen([sys.executable, client_py, srv.address, name,
                                 "hold", "3", str(8 << 20)],
                                stdout=subprocess.PIPE, text=True, env=env)
        while not proc.stdout.readline().startswith("ready"):
            pass
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        start = time.monotonic()
        while srv.client_usage(name) != (0, 0):
            time.sleep(0.002)
        out.append(time.monotonic() - start)
    return out


def materialize_load(srv, clients, seconds):
    pb, pb_grpc = serverproc.import_protos()
    import grpc
    model = pb.ModelSpec(
        tensors=[pb.TensorSpec(name="w", shape=[256 * 1024], dtype="float32")],
        init_rules=[pb.InitRule(pattern="*", init=pb.InitScheme(
            normal=pb.Normal(std=0.02)))])
    latencies = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(n):
        channel = grpc.insecure_channel(srv.address)
        stub = pb_grpc.MaterializerStub(channel)
        md = (("x-materializer-client", f"load-{n}"),)
        mine = []
        while time.monotonic() < stop:
            t0 = time.monotonic()
            h = stub.Materialize(pb.MaterializeRequest(model=model),
                                 metadata=md).handle
            mine.append(time.monotonic() - t0)
            stub.Release(pb.ReleaseRequest(handle=h), metadata=md)
        channel.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(n,))
               for n in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.monotonic() - t0


def machine():
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()

    lines = []
    with serverproc.running_server([f"--session_grace={GRACE_S}s"]) as srv:
        cleanup = cleanup_latency(srv, args.runs)
        lines.append(f"Cleanup after SIGKILL (grace {GRACE_S:.1f} s, "
                     f"{args.runs} runs): p50 {statistics.median(cleanup):.3f} s, "
                     f"max {max(cleanup):.3f} s; beyond the grace period: "
                     f"p50 {statistics.median(cleanup) - GRACE_S:+.3f} s, "
                     f"max {max(cleanup) - GRACE_S:+.3f} s.")
        lines.append("")
        lines.append("| clients | calls | p50 ms | p99 ms | calls/s | p50 vs 1 client |")
        lines.append("|---:|---:|---:|---:|---:|---:|")
        base = None
        for clients in (1, 8, 64):
            lat, wall = materialize_load(srv, clients, args.seconds)
            p50 = percentile(lat, 50) * 1e3
            p99 = percentile(lat, 99) * 1e3
            base = base or p50
            lines.append(f"| {clients} | {len(lat)} | {p50:.2f} | {p99:.2f} | "
                         f"{len(lat) / wall:.0f} | {p50 / base:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        section = "\n".join([
            BEGIN, "## Sessions and admission (bench/sessions.py)", "",
            f"- command: `.venv/bin/python bench/sessions.py --runs {args.runs} "
            f"--seconds {args.seconds:g} --write`",
            f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"- machine: {machine()}",
            "- module: one float32 tensor of 1 MiB, normal(0, 0.02), portable "
            "mode; each client loops materialize + release over its own "
            "channel", "", text, END])
        with open(RESULTS, encoding="utf-8") as f:
            old = f.read()
        if BEGIN in old:
            old = old[:old.index(BEGIN)] + old[old.index(END) + len(END) + 1:]
        with open(RESULTS, "w", encoding="utf-8") as f:
            f.write(old.rstrip("\n") + "\n\n" + section + "\n")


if __name__ == "__main__":
    main()
