"""CommitLog flushing: group commit for SYNC_FLUSH, a timer for ASYNC_FLUSH.

`store.flush()` (fsync of CommitLog and consume queues) runs in a worker thread so the
event loop keeps serving. Under SYNC_FLUSH a send is acknowledged only after a flush that
covers its last byte; all sends waiting at the same time share one fsync (Java's
GroupCommitService), so throughput does not collapse to one fsync per message.
"""

from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)

# After a failed fsync, wait this long before trying again (no hot loop on a dead disk).
_RETRY_AFTER_ERROR_S = 0.2


class GroupCommitService:
    """Waiters for "flushed up to offset N", served by one flushing task."""

    def __init__(self, store, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._waiters: list[tuple[int, trio.Event]] = []
        self._kick = trio.Event()
        self.flushes = 0
        self.failing = False
        self._flushed = 0  # CommitLog offset covered by the last completed flush

    async def wait_flushed(self, end_offset: int) -> bool:
        """Wait until the CommitLog is durable up to `end_offset`; False on timeout
        (the send is then answered FLUSH_DISK_TIMEOUT, code 10)."""
        if self._flushed >= end_offset or self.store.flushed_offset >= end_offset:
            return True
        waiter = (end_offset, trio.Event())
        self._waiters.append(waiter)
        self._kick.set()
        try:
            with trio.move_on_after(self.timeout_s):
                await waiter[1].wait()
        finally:
            if not waiter[1].is_set():
                # Timed out or cancelled: forget it, or waiters pile up without bound
                # while fsync keeps failing.
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
        # Not event.is_set(): release_all() wakes waiters at shutdown without a flush.
        return self._flushed >= end_offset

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._kick.wait()
            self._kick = trio.Event()
            if not self._waiters:
                continue
            try:
                flushed = await trio.to_thread.run_sync(self.store.flush)
            except Exception:
                if not self.failing:  # once per outage, not every retry
                    log.exception("sync flush failed")
                self.failing = True
                await trio.sleep(_RETRY_AFTER_ERROR_S)
                self._kick.set()
                continue
            if self.failing:
                log.info("sync flush works again")
                self.failing = False
            self.flushes += 1
            self._flushed = max(self._flushed, flushed)
            # Waiters that arrived while the thread flushed are in the list too.
            pending = []
            for end, event in self._waiters:
                if end <= flushed:
                    event.set()
                elif not event.is_set():
                    pending.append((end, event))
            self._waiters = pending
            if pending:
                self._kick.set()

    def release_all(self) -> None:
        """Wake every waiter (shutdown); those not covered by a flush report False."""
        for _end, event in self._waiters:
            event.set()
        self._waiters.clear()


async def async_flush_loop(store, interval_ms: int) -> None:
    """ASYNC_FLUSH: flush every `interval_ms` in a worker thread (Java's FlushRealTimeService).
    A put is acknowledged after the append; the page cache carries it through a crash of
    the process, and this timer bounds what a power loss could take."""
    interval = max(interval_ms, 1) / 1000.0
    last = -1
    while True:
        await trio.sleep(interval)
        if store.max_physical_offset == last:
            continue
        try:
            last = await trio.to_thread.run_sync(store.flush)
        except Exception:
            log.exception("async flush failed")
            await trio.sleep(_RETRY_AFTER_ERROR_S)

