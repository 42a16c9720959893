"""One blocking native client per name-server set and process (the Spark driver, and each
Python worker, which Spark reuses across tasks), kept for the life of the process."""

from __future__ import annotations

import threading

from core.client.blocking import BlockingClient

_clients: dict[tuple[str, float], BlockingClient] = {}
_lock = threading.Lock()


def client_for(namesrv: str, request_timeout: float = 10.0) -> BlockingClient:
    """The process's client for `namesrv` (created on first use; closed at exit)."""
    key = (namesrv, request_timeout)
    with _lock:
        c = _clients.get(key)
        if c is None or c._closed:
            c = BlockingClient(namesrv, request_timeout=request_timeout)
            _clients[key] = c
        return c
