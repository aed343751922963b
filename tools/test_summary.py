"""Counts test cases from Bazel's test.xml files (the optimized run, the
ThreadSanitizer run, the ASan + UBSan run), pytest's JUnit XML and the fuzz
stage's JUnit XML (one case per fuzz target), and prints the final
"N passed, N failed" line of ./dev test.

A test case counts as failed if its XML says so. A runner that failed
without leaving a failing case behind (a crash before XML was written, a
timeout, pytest failing to collect) counts as one more failure, so a broken
run can never print "0 failed".
"""

import argparse
import pathlib
import sys
import xml.etree.ElementTree as ElementTree


def count_cases(path: pathlib.Path) -> tuple[int, int, list[str]]:
    """Returns (passed, failed, names of failed cases) for one XML file."""
    passed = failed = 0
    failures = []
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        return 0, 1, [f"{path}: unreadable test XML ({error})"]
    for case in root.iter("testcase"):
        if case.get("status") == "notrun" or case.find("skipped") is not None:
            continue
        name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(name)
        else:
            passed += 1
    return passed, failed, failures


def count_bazel(logs: pathlib.Path, targets: pathlib.Path, exit_code: int,
                label: str) -> tuple[int, int, list[str]]:
    """Cases of one `bazel test` run over the targets listed in `targets`."""
    passed = failed = 0
    failures = []
    logs = logs.resolve()
    for target in targets.read_text().split():
        # //server/spec:validate_test -> <testlogs>/server/spec/validate_test
        package, _, name = target.removeprefix("//").partition(":")
        xml = logs / package / name / "test.xml"
        if not xml.exists():
            failed += 1
            failures.append(f"{target}{label}: no result (not built or not run)")
            continue
        p, f, names = count_cases(xml)
        passed += p
        failed += f
        failures += [f"{target}{label}: {n}" for n in names]
    # Exit 3 = some tests failed; anything else non-zero = build or infra
    # failure. Either must show up as at least one failure.
    if exit_code != 0 and failed == 0:
        failed = 1
        failures.append(f"bazel test{label} exited with {exit_code} "
                        "(build error, timeout or crash; see its output above)")
    return passed, failed, failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bazel-testlogs", type=pathlib.Path, required=True)
    parser.add_argument("--bazel-targets", type=pathlib.Path, required=True,
                        help="file listing the test targets, one per line")
    parser.add_argument("--bazel-exit", type=int, required=True)
    # The ThreadSanitizer run of the concurrency tests (optional).
    parser.add_argument("--tsan-testlogs", type=pathlib.Path)
    parser.add_argument("--tsan-targets", type=pathlib.Path)
    parser.add_argument("--tsan-exit", type=int, default=0)
    # The ASan + UBSan run of every C++ test (optional).
    parser.add_argument("--asan-testlogs", type=pathlib.Path)
    parser.add_argument("--asan-targets", type=pathlib.Path)
    parser.add_argument("--asan-exit", type=int, default=0)
    # The fuzz stage: fuzz/run.py's JUnit XML and exit status (optional).
    parser.add_argument("--fuzz-junit", type=pathlib.Path)
    parser.add_argument("--fuzz-exit", type=int, default=0)
    parser.add_argument("--junit", type=pathlib.Path, required=True)
    parser.add_argument("--pytest-exit", type=int, required=True)
    args = parser.parse_args()

    passed = failed = 0
    failures = []

    for logs, targets, code, label in (
            (args.bazel_testlogs, args.bazel_targets, args.bazel_exit, ""),
            (args.tsan_testlogs, args.tsan_targets, args.tsan_exit,
             " (tsan)"),
            (args.asan_testlogs, args.asan_targets, args.asan_exit,
             " (asan)")):
        if logs is None:
            continue
        p, f, names = count_bazel(logs, targets, code, label)
        passed += p
        failed += f
        failures += names

    py_failed = 0
    if args.junit.exists():
        p, f, names = count_cases(args.junit)
        passed += p
        py_failed += f
        failures += [f"tests/python: {n}" for n in names]
    if args.pytest_exit != 0 and py_failed == 0:
        py_failed = 1
        failures.append(f"pytest exited with {args.pytest_exit}")
    failed += py_failed

    if args.fuzz_junit is not None or args.fuzz_exit != 0:
        fuzz_failed = 0
        if args.fuzz_junit is not None and args.fuzz_junit.exists():
            p, f, names = count_cases(args.fuzz_junit)
            passed += p
            fuzz_failed += f
            failures += [f"fuzz: {n}" for n in names]
        if args.fuzz_exit != 0 and fuzz_failed == 0:
            fuzz_failed = 1
            failures.append(f"fuzz stage exited with {args.fuzz_exit} "
                            "(build error or crash; see its output above)")
        failed += fuzz_failed

    if failures:
        print("\nFailed:")
        for name in failures:
            print(f"  {name}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
