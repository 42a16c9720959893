"""The checkpoint: the CommitLog offset up to which records and their ConsumeQueue units
are known to be on disk. Recovery starts its scan there, so restart time depends on the
flush interval, not on the size of the data.

```
slot (32 bytes, big-endian), two slots written alternately:
  uint32 magic | uint32 version | int64 sequence | int64 physical offset |
  uint32 crc32 of the 24 bytes before | 4 bytes padding
```
A torn write can only damage the slot being written; the other still holds the previous
checkpoint, and recovery takes the valid slot with the higher sequence.
"""

from __future__ import annotations

import os
import struct
import zlib

_SLOT = struct.Struct(">IIqqI")  # magic, version, sequence, physical offset, crc
_SLOT_SIZE = 32
_MAGIC = 0x4C4D5143  # "LMQC"
_VERSION = 1


class Checkpoint:
    """Reads and writes the two-slot checkpoint file. `write` is called from the flusher
    thread only (under the store's flush lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0
        self.physical_offset: int | None = None
        self._load()

    def _load(self) -> None:
        raw = os.pread(self._fd, 2 * _SLOT_SIZE, 0)
        best: tuple[int, int] | None = None
        for i in range(2):
            chunk = raw[i * _SLOT_SIZE : i * _SLOT_SIZE + _SLOT.size]
            if len(chunk) < _SLOT.size:
                continue
            magic, version, seq, phys, crc = _SLOT.unpack(chunk)
            if magic != _MAGIC or version != _VERSION:
                continue
            if zlib.crc32(chunk[: _SLOT.size - 4]) != crc:
                continue
            if best is None or seq > best[0]:
                best = (seq, phys)
        if best is not None:
            self._seq, self.physical_offset = best

    def write(self, physical_offset: int) -> None:
        """Durably record `physical_offset` (pwrite + fdatasync of one slot)."""
        self._seq += 1
        head = struct.pack(">IIqq", _MAGIC, _VERSION, self._seq, physical_offset)
        slot = head + struct.pack(">I", zlib.crc32(head))
        os.pwrite(self._fd, slot.ljust(_SLOT_SIZE, b"\0"), (self._seq % 2) * _SLOT_SIZE)
        os.fdatasync(self._fd)
        self.physical_offset = physical_offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
