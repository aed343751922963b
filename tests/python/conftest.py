"""Session fixture: one materializerd for the whole Python suite (see
serverproc.py for how it is started and the helpers it offers).

The trainer package is imported from the checkout (python/), before any
test imports the generated code, so that `materializer` is always that
package (its materializer.v1 is Bazel's output, MATERIALIZER_PY_PROTO)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "python"))

import serverproc  # noqa: E402


@pytest.fixture(scope="session")
def server():
    with serverproc.running_server() as srv:
        yield srv
