"""A trio run in a background thread, for tests that drive blocking clients (paho, pika)
against servers of this process."""

from __future__ import annotations

import threading
from typing import Any

import trio


class TrioThread:
    """A subclass writes `async def _main()`, which sets `self._ready` once its servers
    listen and keeps them until they are stopped. `start_thread()` runs it in a daemon
    thread and waits for that (a failure to start is raised in the test's thread);
    `call()` runs a sync function on its loop."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start_thread(self, what: str, timeout: float = 60.0) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(timeout), f"{what} did not start"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main_with_token)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._ready.set()

    async def _main_with_token(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        await self._main()

    async def _main(self) -> None:
        raise NotImplementedError

    def call(self, fn, *args: Any) -> Any:
        """Run `fn(*args)` in the trio thread (sync functions only)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
