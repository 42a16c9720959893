"""Writing a metadata file off the event loop (topics.json, subscriptionGroup.json).

A `FilePersister` owns one file. Changes are counted (`mark_dirty`); its `run` task, started in
the broker's nursery, encodes a snapshot on the event loop (the tables change there, so the
snapshot is consistent and its cost is bounded by the table sizes) and writes + fsyncs it in a
worker thread. One write is in flight per file; the changes made while it runs are coalesced
into the next write. A peer that makes the broker create a topic or a group (a send, a
heartbeat) therefore never holds the loop on the disk.

`flush()` waits until every change made before the call is durable (administrator requests
answer after that). Without a running `run` task (loading, shutdown, tools and tests that drive
a manager directly) callers use the synchronous `write_now`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import trio

from core.broker.metadata import atomic_write_bytes

log = logging.getLogger(__name__)

#: Pause before a failed write (disk full, EIO) is tried again.
RETRY_DELAY_S = 1.0


class FilePersister:
    """One file, one write in flight, changes coalesced (see the module docstring)."""

    def __init__(self, path: str, encode: Callable[[], bytes]) -> None:
        self.path = path
        self._encode = encode
        self._changes = 0  # changes made so far
        self._durable = 0  # changes covered by the last successful write
        self._failed = 0  # changes covered by the last failed write
        self._attempts = 0  # writes finished (either way)
        self._failed_attempt = 0  # number of the last failed one
        self._error: OSError | None = None
        self._running = False
        self._wake = trio.Event()
        self._done = trio.Event()
        # Serialises writes of the path: the worker thread against the sync path.
        self._lock = threading.Lock()
        self._on_disk = -1  # changes covered by the file's content (under _lock)

    @property
    def dirty(self) -> bool:
        return self._changes > self._durable

    @property
    def running(self) -> bool:
        return self._running

    def mark_dirty(self) -> bool:
        """Record a change; True when the running persister will write it, False when the
        caller must (no persister task: `write_now`)."""
        self._changes += 1
        if self._running:
            self._wake.set()
            return True
        return False

    def _write(self, payload: bytes, target: int) -> None:
        with self._lock:
            # A payload older than the one on disk (two writers raced) is dropped.
            if target < self._on_disk:
                return
            atomic_write_bytes(self.path, payload)
            self._on_disk = target

    def write_now(self, *, force: bool = False) -> None:
        """Encode and write on the calling thread (sync callers, load and shutdown)."""
        if not (self.dirty or force):
            return
        target = self._changes
        self._write(self._encode(), target)
        self._durable = max(self._durable, target)

    def _notify(self) -> None:
        self._done.set()
        self._done = trio.Event()

    async def _write_in_thread(self) -> None:
        target = self._changes
        payload = self._encode()
        try:
            await trio.to_thread.run_sync(self._write, payload, target)
        except OSError as exc:
            self._failed = target
            self._error = exc
            self._attempts += 1
            self._failed_attempt = self._attempts
            raise
        else:
            self._durable = max(self._durable, target)
            self._attempts += 1
        finally:
            self._notify()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write whenever something changed, until cancelled (the caller's shutdown then
        persists with `write_now`)."""
        self._running = True
        task_status.started()
        try:
            while True:
                while not self.dirty:
                    await self._wake.wait()
                    self._wake = trio.Event()
                self._wake = trio.Event()
                try:
                    await self._write_in_thread()
                except OSError as exc:
                    log.error("cannot persist %s: %s (retrying)", self.path, exc)
                    await trio.sleep(RETRY_DELAY_S)
        finally:
            self._running = False
            self._notify()

    @property
    def changes(self) -> int:
        """Number of the latest change (`flush(upto=...)` waits for one)."""
        return self._changes

    def is_durable(self, change: int) -> bool:
        return self._durable >= change

    async def flush(self, upto: int | None = None) -> None:
        """Return once every change made before the call (or up to change `upto`) is on
        disk; raises the OSError of a write that held them and failed after the call (the
        persister keeps trying)."""
        target = self._changes if upto is None else upto
        start = self._attempts
        while self._durable < target:
            if not self._running:
                await self._write_in_thread()
                continue
            if self._failed_attempt > start and self._failed >= target:
                assert self._error is not None
                raise self._error
            done = self._done
            await done.wait()
