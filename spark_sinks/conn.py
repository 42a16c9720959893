"""One blocking native client per name-server set and process (the Spark driver, and each
Python worker, which Spark reuses across tasks), kept for the life of the process."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from core.client.blocking import BlockingClient

_clients: dict[tuple[str, float], BlockingClient] = {}
_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
#: Threads that hand requests to the client thread, so a task can keep several in flight
#: (the source's pulls, the sink's chunks) while it converts rows.
POOL_THREADS = 16


def client_for(namesrv: str, request_timeout: float = 10.0) -> BlockingClient:
    """The process's client for `namesrv` (created on first use; closed at exit)."""
    key = (namesrv, request_timeout)
    with _lock:
        c = _clients.get(key)
        if c is None or c._closed:
            c = BlockingClient(namesrv, request_timeout=request_timeout)
            _clients[key] = c
        return c


def request_pool() -> ThreadPoolExecutor:
    """The process's pool of threads that block on client calls (see POOL_THREADS)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="lmq-spark")
        return _pool
