"""Runs libFuzzer targets built by `./dev fuzz` (--config=asan) for a bounded
time each and reports executions and findings.

    python3 fuzz/run.py --bin-dir DIR --seconds S [--jobs J] [--junit OUT.xml]
        [--keep-going] [TARGET...] [libFuzzer flags]

Targets run J at a time (default: one per core); each libFuzzer process
uses one core.

Each target fuzzes into a working corpus under .build/fuzz/<target>/corpus
(kept between runs, not committed), seeded by the committed
fuzz/corpus/<target>/, with fuzz/dict/<target>.dict when there is one.
A finding (crash, failed property, leak, timeout, out of memory) is saved
under .build/fuzz/<target>/findings/ and printed with the command that
replays it; commit it to fuzz/corpus/<target>/ as found-<what> once it is
understood, so the corpus test keeps it fixed. Exit status 1 on a finding.
"""

import argparse
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(REPO, ".build", "fuzz")

# Per-target libFuzzer flags. -max_len: inputs are small structures; the
# committed regression inputs can be longer (libFuzzer still runs them
# whole when it loads the corpus). -timeout: one input may take this long.
# The request fuzzer goes through LibTorch, whose large heap made two of
# libFuzzer's own features the bottleneck (perf, 25-30 s runs on the 2-core
# VM): the leak check after every input whose mallocs and frees differ
# (a full LeakSanitizer scan: 61% of the time, 7 executions per second),
# and, without it, the entropic scheduler's per-feature bookkeeping
# (UpdateFeatureFrequency: 46%, about 440 per second). Without both:
# about 1,460 per second. Leaks are still reported when the process ends
# (detect_leaks=1 below), and the target checks after every input that
# the ledger and the registry are empty.
FLAGS = {
    "request_fuzzer": ["-max_len=65536", "-timeout=30", "-detect_leaks=0", "-entropic=0"],
    "glob_fuzzer": ["-max_len=4096", "-timeout=10"],
    "weight_file_fuzzer": ["-max_len=1024", "-timeout=10"],
    "request_file_fuzzer": ["-max_len=65536", "-timeout=10"],
}
COMMON = ["-rss_limit_mb=4096", "-print_final_stats=1", "-reload=0"]

SANITIZER_ENV = {
    # Leaks inside the uninstrumented libraries are not ours.
    "ASAN_OPTIONS": "detect_leaks=1:handle_segv=1:allocator_may_return_null=1",
    "LSAN_OPTIONS": "suppressions=" + os.path.join(REPO, "bazel", "asan",
                                                   "asan.supp"),
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


def targets_with_corpus():
    return sorted(os.listdir(os.path.join(REPO, "fuzz", "corpus")))


def run_target(binary, target, seconds, extra):
    work = os.path.join(WORK, target)
    corpus = os.path.join(work, "corpus")
    findings = os.path.join(work, "findings")
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(findings, exist_ok=True)
    before = set(os.listdir(findings))
    command = [binary, corpus, os.path.join(REPO, "fuzz", "corpus", target),
               f"-max_total_time={seconds}",
               f"-artifact_prefix={findings}/", *COMMON,
               *FLAGS.get(target, []), *extra]
    dictionary = os.path.join(REPO, "fuzz", "dict", f"{target}.dict")
    if os.path.exists(dictionary):
        command.append(f"-dict={dictionary}")
    log_path = os.path.join(work, "last-run.log")
    start = time.monotonic()
    with open(log_path, "wb") as log:
        # Well past -max_total_time: loading a large corpus counts too.
        try:
            code = subprocess.run(
                ["nice", *command], stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **SANITIZER_ENV}, cwd=REPO,
                timeout=seconds * 3 + 300).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    elapsed = time.monotonic() - start
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # The final stats line, or (fork mode) the last progress line "#N: ...".
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", text)
    runs += re.findall(r"^#(\d+)", text, flags=re.MULTILINE)
    runs = sorted(int(n) for n in runs)
    new = sorted(set(os.listdir(findings)) - before)
    return {
        "target": target,
        "code": code,
        "executions": runs[-1] if runs else 0,
        "seconds": elapsed,
        "findings": [os.path.join(findings, n) for n in new],
        "log": log_path,
        "tail": text[-3000:],
    }


def write_junit(results, path):
    suite = ElementTree.Element("testsuite", name="fuzz",
                                tests=str(len(results)))
    for r in results:
        case = ElementTree.SubElement(
            suite, "testcase", classname="fuzz", name=r["target"],
            time=f"{r['seconds']:.1f}")
        if not passed(r):
            failure = ElementTree.SubElement(case, "failure",
                                             message=summary(r))
            failure.text = r["tail"]
    ElementTree.ElementTree(suite).write(path, encoding="utf-8",
                                         xml_declaration=True)


def passed(r):
    return r["code"] == 0 and not r["findings"]


def summary(r):
    line = (f"{r['target']}: {r['executions']} executions in "
            f"{r['seconds']:.0f} s, {len(r['findings'])} findings")
    if r["code"] != 0 and not r["findings"]:
        line += f" (exit {r['code']}; see {os.path.relpath(r['log'], REPO)})"
    return line


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", required=True,
                        help="folder holding the --config=asan binaries")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="targets fuzzed at once (default: one per core)")
    parser.add_argument("--junit", help="write a JUnit XML report here")
    parser.add_argument("--keep-going", action="store_true",
                        help="fork mode: keep fuzzing after a finding "
                        "(each is saved; long runs over known bugs)")
    parser.add_argument("targets", nargs="*",
                        help="default: every target with a corpus")
    args, extra = parser.parse_known_args()
    targets = args.targets or targets_with_corpus()
    if args.keep_going:
        extra = ["-fork=1", "-ignore_crashes=1", "-ignore_timeouts=1",
                 "-ignore_ooms=1", *extra]
    binaries = {}
    for target in targets:
        binaries[target] = os.path.join(args.bin_dir, target)
        if not os.path.exists(binaries[target]):
            sys.exit(f"no fuzz binary {binaries[target]} (unknown target {target}?)")
    jobs = max(1, min(args.jobs, len(targets)))
    print(f"[fuzz] {len(targets)} targets for {args.seconds} s each, {jobs} at a time",
          flush=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_target, binaries[t], t, args.seconds, extra)
                   for t in targets]
        results = []
        for target, future in zip(targets, futures):   # reported in order
            r = future.result()
            results.append(r)
            print(f"[fuzz] {summary(r)}", flush=True)
            for finding in r["findings"]:
                rel = os.path.relpath(finding, REPO)
                print(f"[fuzz]   finding {rel}\n"
                      f"[fuzz]     replay: {os.path.relpath(binaries[target], REPO)} {rel}"
                      f"\n[fuzz]     or (g++): bazel run //fuzz:{target} -- "
                      f"$PWD/{rel}")
            if not passed(r):
                print(r["tail"][-1500:], flush=True)
    if args.junit:
        write_junit(results, args.junit)
    return 0 if all(passed(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
