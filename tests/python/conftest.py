"""Session fixture: one materializerd for the whole Python suite (see
serverproc.py for how it is started and the helpers it offers)."""

import pytest

import serverproc


@pytest.fixture(scope="session")
def server():
    with serverproc.running_server() as srv:
        yield srv
