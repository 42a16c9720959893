"""Child processes of `lmq bench broker`: the servers it measures, each in its own
interpreter, never outliving the bench (SIGTERM on exit, PR_SET_PDEATHSIG if the bench is
killed, and the echo servers also quit when their stdin closes)."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time

import psutil

__all__ = ["Child", "free_port", "listening_pid"]

_STOP_TIMEOUT_S = 30.0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child after fork
    # PR_SET_PDEATHSIG: a bench killed with SIGKILL must not leave servers behind.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """A server process of the bench; `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: list[str], log_path: str, *, port_line: bool) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if port_line else self._log,
            stderr=self._log,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.pid = self.proc.pid

    def read_port(self, timeout: float) -> int:
        """The port announced on the first stdout line ("PORT <n>") of an echo server."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(b"PORT "):
                return int(line.split()[1])
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"server did not start: {self.log_tail()}")

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def last_log_line(self) -> str:
        """The most telling line of the log: the last error, else the last text."""
        lines = [ln.strip().lstrip("|+- ").strip() for ln in self.log_tail(8000).splitlines()]
        lines = [ln for ln in lines if any(ch.isalpha() for ch in ln)]
        errors = [ln for ln in lines if "Error" in ln or "ERROR" in ln or "Exception:" in ln]
        return (errors or lines or [""])[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._log.close()


def listening_pid(port: int) -> int | None:
    """Pid of the local process listening on `port` (for --target), if visible."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    except (psutil.Error, OSError):
        pass
    return None
