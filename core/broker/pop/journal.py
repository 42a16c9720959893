"""The POP state journal: `<data_dir>/pop/journal` (docs/pop.md, "Durability").

An append-only text file, one record per line, each ending in its CRC32:

    C <group> <topic> <queueId> <cursor>                                   <crc>
    H <group> <topic> <queueId> <offset> <popTime> <deadline> <deliveries> <holder> <crc>
    A <group> <topic> <queueId> <offset>                                   <crc>
    P <group> <topic> <queueId> <popTime> <deadline> <deliveries> <holder> <offset>,... <crc>
    B <group> <topic> <queueId> <offset>,<offset>,...                      <crc>

C: the queue's pop cursor (first offset never handed out); H: a message handed out (or
its handle/deadline changed; `holder` is `@<holder id>` or `-`); A: a message gone from
flight (acknowledged or dead-lettered). P and B are H and A for several offsets of one
queue at once (the messages of one pop, the acks of one BATCH_ACK entry): one line, one
CRC, instead of one per message; replay expands them. Group and topic names cannot hold spaces (validated names). Records of a
request are written with one `os.write` before the response is sent: a broker killed
with -9 loses nothing the kernel got (the page cache survives the process). There is no
fsync per write: a power loss can lose the last changes (acked messages may then come
back — at least once). Replay stops at the first line that is torn or fails its CRC.

Volatile states (docs/pop.md "Volatile states"): a (group, topic, queue) whose pops all
said `volatile` (a non-durable AMQP queue) writes no records at all: its `QueueState`
holds `DISCARD` instead of the journal, whose writers do nothing, and `state_lines`
leaves it out of snapshots (compaction, a slave's feed). A durable pop of it turns it
durable for good: its live state is written then (`state_lines`) and journaled after.

Bounded: when the file exceeds `POP_JOURNAL_COMPACT_BYTES` and four times the size of a
snapshot, it is rewritten as a snapshot of the live state (a C line per queue, an H line
per in-flight message), written and fsynced in a worker thread, then renamed over it.
"""

from __future__ import annotations

import logging
import os
import zlib

import trio

__all__ = ["PopJournal", "POP_JOURNAL_COMPACT_BYTES", "DISCARD", "state_lines"]

log = logging.getLogger(__name__)

#: Smallest journal size that triggers a compaction.
POP_JOURNAL_COMPACT_BYTES = 8 * 1024 * 1024


_FIELDS = {"C": 5, "H": 9, "A": 5, "P": 9, "B": 5}


def _line(payload: str) -> bytes:
    data = payload.encode("utf-8")
    return data + b" %08x\n" % zlib.crc32(data)


class PopJournal:
    #: A volatile state's sink is `DISCARD` (the journal itself is not volatile).
    volatile = False

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "journal")
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self.size = 0
        self._compacting: list[bytes] | None = None
        # s4-ha replication hook: called with the bytes of each flush (core/broker/ha/pop_sync.py).
        self.replicate = None

    # ------------------------------------------------------------------ reading
    def replay(self):
        """Yield the parsed records ((kind, fields...)) of a valid prefix."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        for line in raw.split(b"\n"):
            if not line:
                continue
            data, _, crc = line.rpartition(b" ")
            try:
                if int(crc, 16) != zlib.crc32(data):
                    break
                parts = data.decode("utf-8").split(" ")
                kind = parts[0]
                if _FIELDS.get(kind) != len(parts):
                    break
                if kind == "H":
                    holder = parts[8][1:] if parts[8].startswith("@") else None
                    if holder is None and parts[8] != "-":
                        break
                    yield (kind, parts[1], parts[2], *(int(x) for x in parts[3:8]), holder)
                elif kind == "P":
                    holder = parts[7][1:] if parts[7].startswith("@") else None
                    if holder is None and parts[7] != "-":
                        break
                    qid, pop_time, deadline, deliveries = (int(x) for x in parts[3:7])
                    for off in [int(x) for x in parts[8].split(",")]:
                        yield ("H", parts[1], parts[2], qid, off, pop_time, deadline,
                               deliveries, holder)
                elif kind == "B":
                    qid = int(parts[3])
                    for off in [int(x) for x in parts[4].split(",")]:
                        yield ("A", parts[1], parts[2], qid, off)
                else:
                    yield (kind, parts[1], parts[2], *(int(x) for x in parts[3:]))
            except (ValueError, UnicodeDecodeError):
                break

    def open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self._fd).st_size

    # ------------------------------------------------------------------ writing
    def cursor(self, group: str, topic: str, qid: int, cursor: int) -> None:
        self._pending.append(_line(f"C {group} {topic} {qid} {cursor}"))

    def hand(self, group: str, topic: str, qid: int, offset: int, pop_time: int,
             deadline: int, deliveries: int, holder: str | None = None) -> None:
        h = "-" if holder is None else "@" + holder
        self._pending.append(_line(
            f"H {group} {topic} {qid} {offset} {pop_time} {deadline} {deliveries} {h}"))

    def gone(self, group: str, topic: str, qid: int, offset: int) -> None:
        self._pending.append(_line(f"A {group} {topic} {qid} {offset}"))

    def hand_many(self, group: str, topic: str, qid: int, offsets: list[int], pop_time: int,
                  deadline: int, deliveries: int, holder: str | None = None) -> None:
        """`hand` for several offsets with the same fields (one P line)."""
        h = "-" if holder is None else "@" + holder
        self._pending.append(_line(f"P {group} {topic} {qid} {pop_time} {deadline} "
                                   f"{deliveries} {h} " + ",".join(map(str, offsets))))

    def gone_many(self, group: str, topic: str, qid: int, offsets: list[int]) -> None:
        """`gone` for several offsets (one B line)."""
        self._pending.append(_line(f"B {group} {topic} {qid} " + ",".join(map(str, offsets))))

    def lines(self, lines: list[bytes]) -> None:
        """Stage ready-made records (`state_lines`)."""
        self._pending += lines

    def flush(self) -> None:
        """Write the records staged by the current request (one write)."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if self._compacting is not None:
            self._compacting.append(data)
        if self._fd is None:
            return
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.size += len(data)
        if self.replicate is not None:
            self.replicate(data)

    def write_replicated(self, data: bytes) -> None:
        """A slave: append records its master's journal flushed (s4-ha, docs/ha.md)."""
        self._pending.append(data)
        self.flush()

    def needs_compaction(self, live_records: int) -> bool:
        # ~64 bytes a record.
        return (self._compacting is None and self.size > POP_JOURNAL_COMPACT_BYTES
                and self.size > 4 * 64 * max(live_records, 1))

    async def compact(self, snapshot: list[bytes]) -> None:
        """Replace the file by `snapshot` (records of the live state) plus whatever is
        appended meanwhile."""
        self.flush()
        self._compacting = []
        tmp = self.path + ".tmp"

        def write() -> None:
            with open(tmp, "wb") as f:
                f.write(b"".join(snapshot))
                f.flush()
                os.fsync(f.fileno())

        try:
            await trio.to_thread.run_sync(write)
            tail = b"".join(self._compacting)
            fd = os.open(tmp, os.O_WRONLY | os.O_APPEND)
            if tail:
                os.write(fd, tail)
            os.replace(tmp, self.path)
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            old, self._fd = self._fd, fd
            if old is not None:
                os.close(old)
            self.size = os.fstat(fd).st_size
        finally:
            self._compacting = None

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


def snapshot_line(kind: str, *fields) -> bytes:
    return _line(" ".join([kind, *map(str, fields)]))


def state_lines(queues) -> list[bytes]:
    """Records of the durable states among `queues` (((group, topic, queue id), QueueState)
    pairs): a C line each, an H line per message in flight. Volatile states are left out."""
    lines = []
    for (group, topic, qid), qs in queues:
        if qs.journal.volatile:
            continue
        lines.append(snapshot_line("C", group, topic, qid, qs.next_offset))
        for offset, e in qs.inflight.items():
            holder = "-" if e.holder is None else "@" + e.holder
            lines.append(snapshot_line("H", group, topic, qid, offset, e.pop_time,
                                       e.deadline, e.deliveries, holder))
    return lines


class _Discard:
    """The journal of a volatile state: the record writers of `PopJournal`, doing nothing."""

    volatile = True

    def cursor(self, *args) -> None:
        pass

    hand = gone = hand_many = gone_many = cursor


DISCARD = _Discard()
