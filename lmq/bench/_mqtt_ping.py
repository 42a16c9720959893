"""A pinging client for `lmq bench mqtt`: is the server's event loop responsive under load?

One MQTT 3.1.1 connection that only sends PINGREQ, one at a time, every `PING_EVERY_S`
while a phase's window runs, and times each PINGRESP (a server that holds its loop for
long answers late, whatever its throughput). It runs as a thread of the bench process,
pinned to the generator's CPUs, and reports `ping_p50_ms`, `ping_p99_ms`, `ping_max_ms`.
"""

from __future__ import annotations

import os
import socket
import threading
import time

__all__ = ["PING_EVERY_S", "Pinger"]

#: Time between a PINGRESP and the next PINGREQ.
PING_EVERY_S = 0.02
_CONNECT = bytes.fromhex("100e00044d515454040200000002") + b"pg"  # client id "pg"
_PINGREQ = b"\xc0\x00"
_PINGRESP = b"\xd0\x00"


class Pinger(threading.Thread):
    """Pings `host:port` from `start_pinging()` to `stop()`; `figures()` after."""

    def __init__(self, host: str, port: int, cpus: tuple[int, ...] = ()) -> None:
        super().__init__(daemon=True, name="bench-pinger")
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(_CONNECT)
        if _recv(self.sock, 4)[:2] != b"\x20\x02":
            raise RuntimeError("pinger: no CONNACK")
        self.cpus = cpus
        self.samples: list[float] = []
        self.failed = 0
        self._halt = threading.Event()

    def run(self) -> None:
        if self.cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, self.cpus)  # this thread only
        while not self._halt.is_set():
            t0 = time.perf_counter()
            try:
                self.sock.sendall(_PINGREQ)
                if _recv(self.sock, 2) != _PINGRESP:
                    self.failed += 1
                    return
            except OSError:
                self.failed += 1
                return
            self.samples.append(time.perf_counter() - t0)
            self._halt.wait(PING_EVERY_S)

    def stop(self) -> None:
        if self._halt.is_set():
            return
        self._halt.set()
        if self.is_alive():
            self.join(15)
        try:
            self.sock.sendall(b"\xe0\x00")
            self.sock.close()
        except OSError:
            pass

    def figures(self) -> dict[str, float]:
        s = sorted(self.samples)
        if not s:
            return {"pings": 0, "ping_failed": self.failed}

        def pct(p: float) -> float:
            return round(1000 * s[min(len(s) - 1, int(len(s) * p / 100))], 3)

        return {"pings": len(s), "ping_p50_ms": pct(50), "ping_p99_ms": pct(99),
                "ping_max_ms": round(1000 * s[-1], 3)}


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data
