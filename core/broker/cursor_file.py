"""The progress file of a broker service (delayOffset.json, transactionCheckOffset.json).

The service's tables change on the event loop, so it encodes the file's content there
(`_snapshot`, which also clears `_dirty`); the atomic write (core/broker/metadata.py)
runs in a worker thread. A lock serialises that write against the synchronous
`persist()` of start-up and shutdown.
"""

from __future__ import annotations

import logging
import threading

import trio

from core.broker.metadata import atomic_write_bytes


class CursorFile:
    """Mixin: `path`, `_dirty` and the writes; the service supplies `_snapshot()`.
    Errors are logged under the service's own module logger."""

    path: str
    _dirty: bool

    def _open_cursor_file(self, path: str) -> None:
        self.path = path
        self._dirty = False
        self._persist_lock = threading.Lock()

    def _snapshot(self) -> bytes:
        raise NotImplementedError

    def persist(self) -> None:
        """Write the file atomically (sync; also used at shutdown)."""
        self._write(self._snapshot())

    def _write(self, payload: bytes) -> None:
        with self._persist_lock:
            atomic_write_bytes(self.path, payload)

    async def _persist_in_thread(self) -> None:
        try:
            await trio.to_thread.run_sync(self._write, self._snapshot())
        except OSError as exc:  # disk full etc.: keep working, try again next pass
            self._dirty = True
            logging.getLogger(type(self).__module__).error(
                "cannot persist %s: %s", self.path, exc)

    def _persist_at_shutdown(self) -> None:
        if self._dirty:
            try:
                self.persist()
            except OSError as exc:
                logging.getLogger(type(self).__module__).error(
                    "cannot persist %s at shutdown: %s", self.path, exc)
