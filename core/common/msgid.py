"""Message ids (docs/protocol.md §7.5).

* Offset msgId: STOREHOST (IPv4 + int32 port) + int64 physical offset, uppercase hex. It
  says where the record is, so VIEW_MESSAGE_BY_ID reads it straight from the CommitLog.
* UNIQ_KEY: the producer's id, carried in the properties; opaque to the broker.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time

_OFFSET_ID = struct.Struct(">4siq")
_OFFSET_ID_V6 = struct.Struct(">16siq")


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """Offset msgId from an 8-byte stored host (4-byte IPv4 + int32 port) and offset."""
    return (store_host[:8] + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Offset msgId -> (ip, port, physical offset). Raises ValueError when malformed."""
    raw = bytes.fromhex(msg_id)
    if len(raw) == 16:
        ip, port, offset = _OFFSET_ID.unpack(raw)
        return socket.inet_ntoa(ip), port, offset
    if len(raw) == 28:
        ip, port, offset = _OFFSET_ID_V6.unpack(raw)
        return socket.inet_ntop(socket.AF_INET6, ip), port, offset
    raise ValueError(f"not an offset message id: {msg_id!r}")


class UniqKeyGenerator:
    """Producer-side UNIQ_KEY ids, laid out as Java's MessageClientIDSetter does:
    IPv4(4) + pid(2) + a per-process random(4) | ms since start of month(4) + counter(2).
    """

    def __init__(self, ip: str = "127.0.0.1") -> None:
        try:
            ip_bytes = socket.inet_aton(ip)
        except OSError:
            ip_bytes = b"\x7f\x00\x00\x01"
        self._prefix = (
            ip_bytes + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        ).hex().upper()
        self._counter = itertools.count()
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _refresh_month(self, now_ms: int) -> None:
        t = time.gmtime(now_ms / 1000)
        start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone)
        month = t.tm_mon + 1
        year = t.tm_year + (month > 12)
        month = month if month <= 12 else 1
        nxt = int(time.mktime((year, month, 1, 0, 0, 0, 0, 0, 0)) - time.timezone)
        self._month_start_ms, self._next_month_ms = start * 1000, nxt * 1000

    def next(self) -> str:
        now_ms = int(time.time() * 1000)
        if now_ms >= self._next_month_ms:
            self._refresh_month(now_ms)
        delta = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        counter = next(self._counter) & 0xFFFF
        return f"{self._prefix}{delta:08X}{counter:04X}"
