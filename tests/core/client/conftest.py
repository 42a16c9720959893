"""Fixtures of the client tests."""

from __future__ import annotations

import pytest

from tests.core.client.cluster import start_cluster


@pytest.fixture(scope="module")
def threaded_cluster():
    """Name server + broker served from a background thread (its own trio run), for tests
    whose body is blocking code (the blocking API, `lmq admin`). Yields a dict with
    `addr` (name server), `broker` (broker address) and `cluster`."""
    box, stop = start_cluster()
    yield box
    stop()
