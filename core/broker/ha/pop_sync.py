"""POP acknowledgement state on the slave (docs/ha.md, "POP state").

The POP state lives in `<data_dir>/pop/journal` (core/broker/pop/journal.py), not in the
CommitLog. The master sends its journal over the HA connection, as frames of their own
(a negative offset in the frame header, see service.py):

    POP_SNAPSHOT      records of the whole live state (a C line per queue, an H line per
                      message in flight), in one or more frames
    POP_SNAPSHOT_END  (empty) the snapshot is complete
    POP_APPEND        records the master's journal appended (one flush, one frame)

A slave session starts with a snapshot; later appends follow in journal order. When the
appends since the last snapshot pass `POP_RESNAPSHOT_BYTES` and four times that snapshot
(the journal's own compaction rule), a new snapshot follows, so the slave's file stays
bounded like the master's. A slave whose outbox passes `POP_BACKLOG_BYTES` (it is not
reading) gets a fresh snapshot instead of the backlog.

The slave writes a snapshot into `journal.tmp` and renames it over its journal at
POP_SNAPSHOT_END (fsynced, in a worker thread); appends go to the journal (or, during a
snapshot, after it in the temporary file). Every line is checked (CRC, as replay checks
it) before it is written: a bad line drops the connection. A promoted slave reloads its
POP service from that journal (`reload_pop_state`).

SYNC_MASTER acks: the feed numbers journal flushes (`PopFeed.seq`); an outbox remembers,
for each frame it queues, the flush it completes; the slave reports how many POP frames
it applied (after an append or a snapshot end), which gives `PopOutbox.confirmed`, the
newest flush it holds. `HAMaster.wait_pop_replicated` waits for it.
"""

from __future__ import annotations

import collections
import os
import zlib

import trio

from core.broker.pop.journal import POP_JOURNAL_COMPACT_BYTES, state_lines

POP_APPEND = -1
POP_SNAPSHOT = -2
POP_SNAPSHOT_END = -3
POP_KINDS = (POP_APPEND, POP_SNAPSHOT, POP_SNAPSHOT_END)

#: A new snapshot after this many bytes of appends (and 4x the last snapshot).
POP_RESNAPSHOT_BYTES = POP_JOURNAL_COMPACT_BYTES
#: Bytes of POP frames queued for one slave before the queue is replaced by a snapshot.
POP_BACKLOG_BYTES = 64 * 1024 * 1024


class PopSyncError(Exception):
    pass


def _snapshot(pop) -> list[bytes]:
    # Volatile states (docs/pop.md "Volatile states") are not replicated: left out here,
    # and their changes never reach the journal's flushes.
    return state_lines(pop.state.queues.items())


class PopOutbox:
    """What one slave connection still has to receive: (kind, bytes) frames in order."""

    def __init__(self, feed: PopFeed) -> None:
        self.feed = feed
        self.frames: list[tuple[int, bytes]] = []
        self.bytes = 0
        self.since_snapshot = 0
        self.snapshot_bytes = 0
        # SYNC_MASTER acks (docs/ha.md, "POP state"): `count` = frames of this session
        # sent or queued; `marks` = (count once a frame is applied, the feed's flush
        # sequence it completes); `confirmed` = the greatest flush sequence the slave
        # reported it holds.
        self.count = 0
        self.marks: collections.deque[tuple[int, int]] = collections.deque()
        self.confirmed = 0
        self.snapshot()

    def snapshot(self) -> None:
        # Frames dropped here are never sent; the snapshot's end covers their flushes.
        self.count -= len(self.frames)
        marks = self.marks
        while marks and marks[-1][0] > self.count:
            marks.pop()
        self.frames.clear()
        self.bytes = 0
        pop = self.feed.pop
        lines = _snapshot(pop) if pop is not None else []
        limit = self.feed.frame_bytes
        part: list[bytes] = []
        size = 0
        for line in lines:
            part.append(line)
            size += len(line)
            if size >= limit:
                self._put(POP_SNAPSHOT, b"".join(part))
                part, size = [], 0
        self._put(POP_SNAPSHOT, b"".join(part))
        self._put(POP_SNAPSHOT_END, b"")
        self.marks.append((self.count, self.feed.seq))
        self.snapshot_bytes = self.bytes
        self.since_snapshot = 0

    def _put(self, kind: int, data: bytes) -> None:
        self.frames.append((kind, data))
        self.bytes += len(data)
        self.count += 1

    def append(self, data: bytes) -> None:
        self.since_snapshot += len(data)
        if (self.bytes + len(data) > POP_BACKLOG_BYTES
                or (self.since_snapshot > POP_RESNAPSHOT_BYTES
                    and self.since_snapshot > 4 * self.snapshot_bytes)):
            # A snapshot replaces what is queued (a whole snapshot is always taken at
            # once, so none is cut in two). `data` follows it: replaying records the
            # state may already hold gives the same state (last write per key wins).
            self.snapshot()
        limit = self.feed.frame_bytes
        for i in range(0, len(data), limit):
            self._put(POP_APPEND, data[i : i + limit])
        self.marks.append((self.count, self.feed.seq))

    def confirm(self, applied: int) -> bool:
        """The slave reports `applied` frames of this session applied; True when that
        confirms a newer flush."""
        marks = self.marks
        seq = self.confirmed
        while marks and marks[0][0] <= applied:
            seq = marks.popleft()[1]
        if seq > self.confirmed:
            self.confirmed = seq
            return True
        return False

    def take(self) -> list[tuple[int, bytes]]:
        frames, self.frames, self.bytes = self.frames, [], 0
        return frames


class PopFeed:
    """Master side: every journal flush goes to the outbox of each connected slave."""

    def __init__(self, master) -> None:
        self.master = master
        self.outboxes: dict[int, PopOutbox] = {}
        self.seq = 0  # journal flushes seen (a SYNC_MASTER ack waits for its own)
        self.frame_bytes = max(4096, master.config.ha_batch_bytes)

    @property
    def pop(self):
        return getattr(self.master.broker, "pop_service", None)

    def open(self, cid: int) -> PopOutbox:
        pop = self.pop
        if pop is not None:
            pop.journal.replicate = self._on_flush  # the journal's replication hook
        box = self.outboxes[cid] = PopOutbox(self)
        return box

    def close(self, cid: int) -> None:
        self.outboxes.pop(cid, None)

    def _on_flush(self, data: bytes) -> None:
        self.seq += 1
        if not self.outboxes:
            return
        for box in self.outboxes.values():
            box.append(data)
        self.master.notify_append()


def check_lines(data: bytes) -> None:
    """Every line of `data` whole and with a valid CRC (what replay accepts)."""
    if data and not data.endswith(b"\n"):
        raise PopSyncError("POP frame does not end with a whole line")
    for line in data.split(b"\n")[:-1]:
        payload, _, crc = line.rpartition(b" ")
        try:
            ok = len(crc) == 8 and int(crc, 16) == zlib.crc32(payload)
        except ValueError:
            ok = False
        if not ok:
            raise PopSyncError("POP frame holds a corrupt journal line")


class PopReplica:
    """Slave side: applies POP frames to the local journal file."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self._tmp: int | None = None
        self.snapshots = 0  # completed snapshots (tests, status)
        self.frames = 0  # POP frames applied in this session (reported to the master)

    @property
    def journal(self):
        pop = getattr(self.broker, "pop_service", None)
        return pop.journal if pop is not None else None

    async def apply(self, kind: int, data: bytes) -> None:
        journal = self.journal
        if journal is None:
            self.frames += 1
            return
        check_lines(data)
        if kind == POP_SNAPSHOT:
            if self._tmp is None:
                os.makedirs(journal.directory, exist_ok=True)
                self._tmp = os.open(journal.path + ".tmp",
                                    os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            _write(self._tmp, data)
        elif kind == POP_APPEND:
            if self._tmp is not None:
                _write(self._tmp, data)
            else:
                journal.write_replicated(data)
        elif kind == POP_SNAPSHOT_END:
            if self._tmp is None:
                raise PopSyncError("POP snapshot end without a snapshot")
            fd, self._tmp = self._tmp, None
            await trio.to_thread.run_sync(_install, fd, journal)
            journal.close()
            journal.open()
            self.snapshots += 1
        self.frames += 1

    def abort(self) -> None:
        """The session ended: a snapshot not completed is dropped."""
        self.frames = 0
        if self._tmp is not None:
            os.close(self._tmp)
            self._tmp = None


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _install(fd: int, journal) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(journal.path + ".tmp", journal.path)
    dfd = os.open(journal.directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def reload_pop_state(broker) -> None:
    """A promoted slave: rebuild the POP service from the journal the master sent."""
    replica = getattr(broker, "ha_pop_replica", None)
    if replica is not None:
        replica.abort()
    pop = getattr(broker, "pop_service", None)
    if pop is None:
        return
    pop.journal.close()
    pop.state = type(pop.state)()
    pop._due.clear()
    pop._scheduled.clear()
    pop._held.clear()
    pop.load()
