"""Ending the child processes the tests start."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    """SIGTERM, and SIGKILL when it has not exited within `timeout` seconds; nothing for a
    process never started or already ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
