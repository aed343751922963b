"""The Hugging Face sweep (hf_sweep.py) over a representative set of model
classes, against the test server: every class passes (describe(), the
values of its steps computed here, and materialize() into the model, each
compared with the model built on the CPU) or is in hf_sweep.KNOWN with
exactly its status and reason."""

import collections
import time

import pytest

pytest.importorskip("transformers")

import hf_sweep  # noqa: E402


def _check(results):
    counts = collections.Counter(r.status for r in results)
    print(f"\n{len(results)} classes: " + ", ".join(f"{counts[s]} {s}" for s in hf_sweep.STATUSES))
    wrong = []
    for r in results:
        known = hf_sweep.KNOWN.get(r.name)
        if r.status == "pass" and known is None:
            continue
        if r.status == "pass":
            wrong.append(f"{r.name}: passes now; remove it from hf_sweep.KNOWN")
        elif known is None:
            wrong.append(f"{r.name}: {r.status}: {r.reason}")
        elif known != (r.status, r.reason):
            wrong.append(f"{r.name}: {r.status}: {r.reason}\n    KNOWN says {known[0]}: {known[1]}")
    assert not wrong, f"{len(wrong)} class(es) differ from hf_sweep.KNOWN:\n" + "\n".join(wrong)


def test_known_names_real_classes():
    classes = hf_sweep.all_classes()
    for name, (status, reason) in hf_sweep.KNOWN.items():
        assert name in classes, name
        assert status in hf_sweep.STATUSES and status != "pass", name
        assert reason, name


def test_hf_sweep_against_the_server(server):
    names = hf_sweep.test_set()
    t0 = time.perf_counter()
    results = hf_sweep.sweep(names, server=server.address)
    print(f"{time.perf_counter() - t0:.0f} s")
    server.assert_idle()
    _check(results)
