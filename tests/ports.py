"""Free TCP ports for servers a test starts with an explicit port.

A port the kernel hands out for port 0 lies in its ephemeral range, and between the moment a
test learns it and the moment its server binds it, any outgoing connection of this machine
(the suite opens thousands) may take it as its local end: the server then fails to bind. So
the ports come from just below the ephemeral range, where the kernel never puts the local
end of an outgoing connection. Each pytest-xdist worker draws from its own slice, and a
process never hands out the same port twice while another is left."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["free_port", "port_free"]

SPAN = 12000  # ports below the ephemeral range to draw from
_given: set[int] = set()
_rng = random.Random()


def _range() -> tuple[int, int]:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = max(1024, low - SPAN)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        width = (low - start) // count
        start += int(worker[2:]) % count * width
        return start, start + width
    return start, low


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether `port` can be bound on `host` now (all interfaces by default)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(taken: set[int] | None = None) -> int:
    """A port nothing listens on now, outside the ephemeral range; `taken` (updated) lists
    ports the caller has already chosen."""
    low, high = _range()
    if len(_given) >= (high - low) // 2:
        _given.clear()  # long runs: the first ports are long closed again
    for _ in range(4 * (high - low)):
        port = _rng.randrange(low, high)
        if port in _given or (taken is not None and port in taken) or not port_free(port):
            continue
        _given.add(port)
        if taken is not None:
            taken.add(port)
        return port
    raise OSError("no free port below the ephemeral range")
