"""Fixtures of the client tests."""

from __future__ import annotations

import threading

import pytest
import trio

from tests.core.client.cluster import cluster


@pytest.fixture(scope="module")
def threaded_cluster():
    """Name server + broker served from a background thread (its own trio run), for tests
    whose body is blocking code (the blocking API, `lmq admin`). Yields a dict with
    `addr` (name server), `broker` (broker address) and `cluster`."""
    ready = threading.Event()
    box: dict = {}

    async def main():
        async with cluster() as c:
            box.update(addr=c.namesrv_addr, broker=c.broker_addrs[0], cluster=c,
                       token=trio.lowlevel.current_trio_token(), stop=trio.Event())
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(30), "cluster did not start"
    yield box
    trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
    thread.join(30)
