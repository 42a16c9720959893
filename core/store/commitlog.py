"""CommitLog: fixed-size mapped files holding every record once (docs/protocol.md §7.9).

Files are named by their start offset (20 digits); PHYSICALOFFSET is global. A record never
straddles files: when a record plus the 8-byte minimum filler does not fit in what is left
of a file, `int32 remaining` + BLANK magic closes the file and the record goes to the next
one (RocketMQ's END_FILE_MIN_BLANK_LENGTH rule).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator

from core.common.codec import (
    BLANK_MAGIC,
    FIXED_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    OFF_PHYSICAL_OFFSET,
    RecordError,
    parse_layout,
    write_blank,
)
from core.common.sysflag import MessageSysFlag
from core.store.mapped_file import MappedFile, file_name, list_numbered_files

END_FILE_MIN_BLANK = 8  # int32 size + int32 BLANK magic
_SIZE_MAGIC = struct.Struct(">iI")
_INT64 = struct.Struct(">q")


class CommitLog:
    """The files of the CommitLog and the arithmetic between offsets and files.

    The append position itself is owned by the store's put path (it packs records straight
    into `current.mm`); this class provides rollover, lookup, validation and deletion.
    """

    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self._first_no = 0

    # ------------------------------------------------------------------ files
    def load(self) -> None:
        """Map the existing files: the contiguous run ending at the newest file (a gap
        means older files were removed by hand; they are unreachable anyway)."""
        os.makedirs(self.directory, exist_ok=True)
        found = list_numbered_files(self.directory)
        run: list[tuple[int, str]] = []
        for start, path in reversed(found):
            if start % self.file_size:
                raise ValueError(f"{path}: not a multiple of commitlog_file_size")
            if run and start != run[-1][0] - self.file_size:
                break
            run.append((start, path))
        run.reverse()
        self.files = [
            MappedFile(path, start, self.file_size)
            for start, path in run
        ]
        self._first_no = run[0][0] // self.file_size if run else 0

    @property
    def first_no(self) -> int:
        """Number of the oldest file (its start offset / file_size): the index of file
        k in `files` is k - first_no."""
        return self._first_no

    @property
    def min_offset(self) -> int:
        return self.files[0].start if self.files else 0

    def new_file(self, start: int) -> MappedFile:
        """Create (or reopen) the file beginning at `start` and append it to the list."""
        mf = MappedFile(
            os.path.join(self.directory, file_name(start)), start, self.file_size, create=True,
        )
        if not self.files:
            self._first_no = start // self.file_size
        self.files.append(mf)
        return mf

    def roll(self, current: MappedFile, pos: int) -> MappedFile:
        """Close `current` at local position `pos` with a BLANK filler and start the next
        file. The next file is created first, so a failure (disk full) leaves no filler."""
        nxt = self.file_for(current.end) or self.new_file(current.end)
        remaining = self.file_size - pos
        if remaining >= END_FILE_MIN_BLANK:
            write_blank(current.mm, pos, remaining)
        current.dirty = True
        return nxt

    def file_for(self, phys: int) -> MappedFile | None:
        i = phys // self.file_size - self._first_no
        if 0 <= i < len(self.files):
            return self.files[i]
        return None

    def slice(self, phys: int, size: int) -> memoryview | None:
        """Zero-copy view of [phys, phys+size) or None when that range no longer exists."""
        i = phys // self.file_size - self._first_no
        if i < 0 or i >= len(self.files) or size <= 0:
            return None
        mf = self.files[i]
        pos = phys - mf.start
        if pos + size > self.file_size:
            return None
        return mf.view[pos : pos + size]

    def record_at(self, phys: int, limit: int) -> memoryview | None:
        """The whole record starting at `phys` (size read from its header), or None when
        there is no well-formed record there or it extends past `limit`."""
        mf = self.file_for(phys)
        if mf is None or phys < 0:
            return None
        pos = phys - mf.start
        if pos + FIXED_SIZE > self.file_size:
            return None
        total, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
        if magic not in (MAGIC_V1, MAGIC_V2) or total < FIXED_SIZE:
            return None
        if pos + total > self.file_size or phys + total > limit:
            return None
        return mf.view[pos : pos + total]

    def delete_first(self) -> MappedFile:
        """Remove the oldest file from the list (retention; the caller destroys it)."""
        mf = self.files.pop(0)
        self._first_no += 1
        return mf

    def close(self) -> None:
        for mf in self.files:
            mf.close()
        self.files = []

    # ------------------------------------------------------------------ recovery
    def scan(self, start: int) -> Iterator[tuple[int, memoryview]]:
        """Yield (offset, record view) of every valid record from `start` on, following
        BLANK fillers to the next file, and stop at the first invalid byte. After the
        iterator ends, `scan_end` is the offset where the valid data ends."""
        self.scan_end = start
        phys = start
        while True:
            mf = self.file_for(phys)
            if mf is None:
                return
            pos = phys - mf.start
            if pos + END_FILE_MIN_BLANK > self.file_size:
                phys = mf.end  # nothing fits after the last record but the file end
                self.scan_end = phys
                continue
            total, magic = _SIZE_MAGIC.unpack_from(mf.mm, pos)
            if magic == BLANK_MAGIC and total == self.file_size - pos:
                phys = mf.end
                self.scan_end = phys
                continue
            if not self.valid_record(mf, pos, phys, total, magic):
                return
            yield phys, mf.view[pos : pos + total]
            phys += total
            self.scan_end = phys

    def valid_record(self, mf: MappedFile, pos: int, phys: int, total: int, magic: int) -> bool:
        """Size, magic, stored PHYSICALOFFSET, layout and body CRC of one record."""
        if magic not in (MAGIC_V1, MAGIC_V2) or total < FIXED_SIZE:
            return False
        if pos + total + END_FILE_MIN_BLANK > self.file_size:
            return False
        if _INT64.unpack_from(mf.mm, pos + OFF_PHYSICAL_OFFSET)[0] != phys:
            return False
        try:
            lay = parse_layout(mf.mm, pos, pos + total)
        except RecordError:
            return False
        crc = struct.unpack_from(">I", mf.mm, pos + 8)[0]
        body = mf.view[lay.body_start : lay.body_start + lay.body_length]
        return (zlib.crc32(body) & 0x7FFFFFFF) == crc


def store_timestamp(record: memoryview) -> int:
    """STORETIMESTAMP of a record (its position depends on the born host's width)."""
    sys_flag = struct.unpack_from(">i", record, 36)[0]
    pos = 68 if sys_flag & MessageSysFlag.BORNHOST_V6 else 56
    return _INT64.unpack_from(record, pos)[0]
