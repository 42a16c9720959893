"""ConsumeQueue: the index of one (topic, queueId) over the CommitLog (docs/protocol.md §7.10).

```
unit (20 bytes, big-endian):  int64 commitlog offset | int32 record size | int64 tag code
```

Units live in mapped files of `units_per_file` units under
`consumequeue/<topic>/<queueId>/<20-digit start byte offset>`; logical offset n is unit n.
Units are written densely, so a file's written units are a prefix of it: the max offset
is found by a binary search for the first unit whose size is 0, never by a scan.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections import deque

from core.store.mapped_file import MappedFile, file_name, list_numbered_files

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 20
_SIZE_AT = struct.Struct(">i")


class ConsumeQueue:
    """One logical queue. All mutating calls come from the store's writer thread."""

    __slots__ = (
        "topic", "queue_id", "directory", "upf", "file_bytes",
        "_files", "_first_no", "_last", "_last_base", "max_offset", "_min_offset",
        "_dirty", "_min_checked_for",
    )

    def __init__(
        self, root: str, topic: str, queue_id: int, units_per_file: int, dirty: deque,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, topic, str(queue_id))
        self.upf = units_per_file
        self.file_bytes = units_per_file * UNIT_SIZE
        self._files: list[MappedFile | None] = []  # index = file number - _first_no
        self._first_no = 0
        self._last: MappedFile | None = None
        self._last_base = 0  # logical offset of the first unit of _last
        self.max_offset = 0
        self._min_offset = 0
        self._dirty = dirty  # the store's queue of files awaiting fdatasync
        self._min_checked_for = -1  # CommitLog min the min offset was last checked against

    # ------------------------------------------------------------------ loading
    def load(self, commitlog_end: int) -> None:
        """Map the existing files, find the max offset and cut units that point at or past
        `commitlog_end` (the CommitLog end recovered at start: such units describe records
        that did not survive a crash)."""
        found = list_numbered_files(self.directory)
        # Keep the contiguous run of files ending at the newest one.
        run: list[int] = []
        for start, _path in reversed(found):
            no = start // self.file_bytes
            if start % self.file_bytes or (run and no != run[-1] - 1):
                break
            run.append(no)
        run.reverse()
        if not run:
            return
        self._first_no = run[0]
        self._files = [None] * len(run)
        self._min_offset = run[0] * self.upf
        # Newest file with a written first unit holds the max offset.
        for i in range(len(run) - 1, -1, -1):
            mf = self._map(i)
            if _SIZE_AT.unpack_from(mf.mm, 8)[0] != 0 or i == 0:
                lo, hi = 0, self.upf  # first empty unit in [lo, hi]
                while lo < hi:
                    mid = (lo + hi) // 2
                    if _SIZE_AT.unpack_from(mf.mm, mid * UNIT_SIZE + 8)[0] != 0:
                        lo = mid + 1
                    else:
                        hi = mid
                self.max_offset = (self._first_no + i) * self.upf + lo
                break
        if self.max_offset == self._min_offset and len(run) > 1:
            # Every file is empty: restart at the last one (offsets never go back).
            self._min_offset = self.max_offset = (self._first_no + len(run) - 1) * self.upf
        # Cut units describing records lost with the CommitLog tail.
        while self.max_offset > self._min_offset:
            phys, size, _tag = self.unit(self.max_offset - 1)
            if size != 0 and phys + size <= commitlog_end:
                break
            self._write_unit(self.max_offset - 1, 0, 0, 0)
            self.max_offset -= 1

    def _path(self, no: int) -> str:
        return os.path.join(self.directory, file_name(no * self.file_bytes))

    def _map(self, i: int) -> MappedFile:
        mf = self._files[i]
        if mf is None:
            no = self._first_no + i
            os.makedirs(self.directory, exist_ok=True)
            # CQ files keep no fd: the flusher reopens the dirty ones by path.
            mf = MappedFile(self._path(no), no * self.file_bytes, self.file_bytes,
                            create=True, keep_fd=False)
            self._files[i] = mf
        return mf

    def _file_for(self, offset: int, create: bool) -> MappedFile | None:
        i = offset // self.upf - self._first_no
        if i < 0:
            return None
        if i >= len(self._files):
            if not create:
                return None
            if not self._files:
                self._first_no = offset // self.upf
                i = 0
            self._files.extend([None] * (i + 1 - len(self._files)))
        return self._map(i)

    def _select_last(self) -> tuple[MappedFile, int]:
        """The file the next unit goes to, and the unit's index in it."""
        mf = self._file_for(self.max_offset, create=True)
        self._last = mf
        self._last_base = (mf.start // self.file_bytes) * self.upf
        return mf, self.max_offset - self._last_base

    # ------------------------------------------------------------------ writing
    def append(self, phys: int, size: int, tags_code: int) -> int:
        """Write the next unit; return its logical offset (the hot path of a put)."""
        off = self.max_offset
        idx = off - self._last_base
        last = self._last
        if last is None or idx >= self.upf:
            last, idx = self._select_last()
        UNIT.pack_into(last.mm, idx * UNIT_SIZE, phys, size, tags_code)
        self.max_offset = off + 1
        if not last.dirty:
            last.dirty = True
            self._dirty.append(last)
        return off

    def append_packed(self, units: bytes) -> None:
        """append() for consecutive units already packed (UNIT layout, a batch): one copy
        per file they span."""
        n = len(units) // UNIT_SIZE
        done = 0
        while done < n:
            off = self.max_offset
            last, idx = self._select_last()
            k = min(n - done, self.upf - idx)
            last.mm[idx * UNIT_SIZE : (idx + k) * UNIT_SIZE] = units[done * UNIT_SIZE : (done + k) * UNIT_SIZE]
            self.max_offset = off + k
            done += k
            if not last.dirty:
                last.dirty = True
                self._dirty.append(last)

    def put_at(self, offset: int, phys: int, size: int, tags_code: int) -> None:
        """Idempotent write at `offset` (CommitLog re-dispatch at recovery). An existing unit
        for the same record is kept as is, so a tag code the broker chose survives."""
        if offset < self._min_offset:
            return
        if offset < self.max_offset:
            cur = self.unit(offset)
            if cur is not None and cur[0] == phys and cur[1] == size:
                return
        self._write_unit(offset, phys, size, tags_code)
        if offset >= self.max_offset:
            self.max_offset = offset + 1
            self._last = None  # re-selected by the next append

    def _write_unit(self, offset: int, phys: int, size: int, tags_code: int) -> None:
        mf = self._file_for(offset, create=True)
        UNIT.pack_into(mf.mm, (offset % self.upf) * UNIT_SIZE, phys, size, tags_code)
        if not mf.dirty:
            mf.dirty = True
            self._dirty.append(mf)

    # ------------------------------------------------------------------ reading
    def unit(self, offset: int) -> tuple[int, int, int] | None:
        if offset < self._min_offset or offset >= self.max_offset:
            return None
        mf = self._file_for(offset, create=False)
        if mf is None:
            return None
        return UNIT.unpack_from(mf.mm, (offset % self.upf) * UNIT_SIZE)

    def units(self, offset: int, count: int) -> list[tuple[int, int, int]]:
        """Units [offset, offset+count) clipped to the queue, crossing files if needed."""
        end = min(offset + count, self.max_offset)
        if offset < self._min_offset:
            offset = self._min_offset
        out: list[tuple[int, int, int]] = []
        upf = self.upf
        while offset < end:
            mf = self._file_for(offset, create=False)
            if mf is None:
                break
            a = (offset % upf) * UNIT_SIZE
            n = min(end - offset, upf - offset % upf)
            out.extend(UNIT.iter_unpack(mf.view[a : a + n * UNIT_SIZE]))
            offset += n
        return out

    def min_offset(self, commitlog_min: int) -> int:
        """First unit whose record still exists (units are ordered by CommitLog offset, so a
        binary search finds it after retention; cached per CommitLog minimum)."""
        if commitlog_min != self._min_checked_for:
            self._min_checked_for = commitlog_min
            lo = self._min_offset
            hi = self.max_offset
            while lo < hi:
                mid = (lo + hi) // 2
                u = self.unit(mid)
                if u is not None and u[0] >= commitlog_min:
                    hi = mid
                else:
                    lo = mid + 1
            self._min_offset = lo
        return self._min_offset

    # ------------------------------------------------------------------ retention
    def delete_expired_files(self, commitlog_min: int) -> int:
        """Delete leading files whose units all point below `commitlog_min` (never the file
        being written). Returns the number of files deleted."""
        deleted = 0
        while len(self._files) > 1:
            mf = self._map(0)
            phys, size, _ = UNIT.unpack_from(mf.mm, self.file_bytes - UNIT_SIZE)
            if size == 0 or phys >= commitlog_min:
                break
            mf.destroy()
            self._files.pop(0)
            self._first_no += 1
            self._min_offset = max(self._min_offset, self._first_no * self.upf)
            deleted += 1
        return deleted

    def close(self) -> None:
        for mf in self._files:
            if mf is not None:
                mf.close()
        self._files = []
        self._last = None

    def destroy(self) -> None:
        """Delete the queue's files (DELETE_TOPIC)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def delete_expired_files_on_disk(directory: str, file_bytes: int, commitlog_min: int) -> int:
    """Retention for a queue that is not loaded: the same rule as
    ConsumeQueue.delete_expired_files, reading only the last unit of each file."""
    files = list_numbered_files(directory)
    deleted = 0
    for _start, path in files[:-1]:
        try:
            with open(path, "rb") as fh:
                fh.seek(file_bytes - UNIT_SIZE)
                raw = fh.read(UNIT_SIZE)
        except OSError:
            break
        if len(raw) < UNIT_SIZE:
            break
        phys, size, _ = UNIT.unpack(raw)
        if size == 0 or phys >= commitlog_min:
            break
        os.unlink(path)
        deleted += 1
    return deleted
