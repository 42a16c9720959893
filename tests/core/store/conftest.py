"""Fixtures for the store tests: real stores in temporary directories, small files."""

from __future__ import annotations

import pytest

from core.common.message import InnerMessage
from core.store import MessageStore, StoreConfig

SMALL = {
    "commitlog_file_size": 64 * 1024,
    "consume_queue_units_per_file": 64,
    # Tests must not depend on how full the machine's disk is (tests of disk pressure
    # set these themselves).
    "disk_max_used_ratio": 1.0,
    "disk_full_ratio": 1.0,
}


@pytest.fixture
def open_store(tmp_path):
    """Factory: open_store(**config) -> started MessageStore in tmp_path/store (small files
    by default); every store it made is shut down at teardown."""
    made: list[MessageStore] = []

    def factory(path=None, **overrides) -> MessageStore:
        cfg = dict(SMALL)
        cfg.update(overrides)
        store = MessageStore(StoreConfig(str(path or tmp_path / "store"), **cfg))
        store.start()
        made.append(store)
        return store

    yield factory
    for store in made:
        store.shutdown()


def msg(topic: str = "T", body: bytes = b"hello", queue_id: int = 0, **props: str) -> InnerMessage:
    """An InnerMessage with string properties given as keywords."""
    return InnerMessage(topic=topic, body=body, queue_id=queue_id, properties=dict(props))


def lmq_msg(lmqs: list[str], topic: str = "T", body: bytes = b"x", queue_id: int = 0,
            **props: str) -> InnerMessage:
    props["INNER_MULTI_DISPATCH"] = ",".join(lmqs)
    return msg(topic, body, queue_id, **props)
