"""Shared by the `lmq bench mqtt` tests: the shortest options that still measure a window,
and module fixtures for a temporary directory and an `lmq serve` in it."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from lmq.bench._mqtt_servers import start_lmq

TINY = ["--duration", "1", "--warmup", "0.3", "--drain", "10", "--pin", "off"]


@pytest.fixture(scope="module")
def tmp_dir():
    d = tempfile.mkdtemp(prefix="lmq-bench-mqtt-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def lmq_server(tmp_dir):
    server = start_lmq(tmp_dir)
    yield server
    server.stop()
