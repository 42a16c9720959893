"""The official RocketMQ 5 Python client in a venv of its own (it and the 4.x `rocketmq`
wheel both install a package named `rocketmq`): created once under a cache directory,
$LMQ_TEST_CACHE or ~/.cache/lmq-tests. Used by `lmq bench grpc` and tests/gateway/grpc5."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

CLIENT = "rocketmq-python-client==5.1.2"


class VenvError(RuntimeError):
    """The venv could not be made (no network to the package index, no venv module)."""


def rmq5_python() -> str:
    """The python of a venv holding the official 5.x client (made on first use)."""
    cache = Path(os.environ.get("LMQ_TEST_CACHE") or Path.home() / ".cache" / "lmq-tests")
    venv = cache / "rmq5-5.1.2"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        return str(python)
    cache.mkdir(parents=True, exist_ok=True)
    # Test workers (pytest-xdist) may get here at once: one makes it, the others wait.
    with open(cache / "rmq5.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            _make(venv, python)
            marker.write_text(CLIENT + "\n")
    return str(python)


def _make(venv: Path, python: Path) -> None:
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                       capture_output=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", CLIENT], check=True,
                       capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = (getattr(exc, "stderr", b"") or b"")[-500:].decode(errors="replace")
        raise VenvError(f"cannot install {CLIENT} into a venv at {venv}: {exc} {detail}") \
            from None
