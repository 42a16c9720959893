"""The official RocketMQ 5 Python client in a virtual environment of its own.

`rocketmq-python-client` and the 4.x C++ wheel `rocketmq` (a test dependency) both
install a top-level package named `rocketmq`, so the 5.x client lives in a venv created
once under a cache directory ($LMQ_TEST_CACHE, else ~/.cache/lmq-tests; lmq/bench/_rmq5_venv.py)
and is driven by subprocess (rmq5_driver.py). Tests that need it skip, saying why, when
the venv cannot be made (no network to the package index, no venv module).
"""

from __future__ import annotations

import pytest

from lmq.bench._rmq5_venv import VenvError
from lmq.bench._rmq5_venv import rmq5_python as _rmq5_python


@pytest.fixture(scope="session")
def rmq5_python() -> str:
    """The python of a venv holding the official 5.x client."""
    try:
        return _rmq5_python()
    except VenvError as exc:
        pytest.skip(str(exc))
