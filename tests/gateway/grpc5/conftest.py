"""The official RocketMQ 5 Python client in a virtual environment of its own.

`rocketmq-python-client` and the 4.x C++ wheel `rocketmq` (a test dependency) both
install a top-level package named `rocketmq`, so the 5.x client lives in a venv created
once under a cache directory ($LMQ_TEST_CACHE, else ~/.cache/lmq-tests) and is driven by
subprocess (rmq5_driver.py). Tests that need it skip, saying why, when the venv cannot be
made (no network to the package index, no venv module).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = "rocketmq-python-client==5.1.2"


def _cache_dir() -> Path:
    return Path(os.environ.get("LMQ_TEST_CACHE") or Path.home() / ".cache" / "lmq-tests")


@pytest.fixture(scope="session")
def rmq5_python() -> str:
    """The python of a venv holding the official 5.x client."""
    venv = _cache_dir() / "rmq5-5.1.2"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                           capture_output=True, timeout=300)
            subprocess.run([str(python), "-m", "pip", "install", "-q", CLIENT], check=True,
                           capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            pytest.skip(f"cannot install {CLIENT} into a venv at {venv}: {exc} "
                        f"{detail[-500:].decode(errors='replace')}")
        marker.write_text(CLIENT + "\n")
    return str(python)
