"""Read-only views of stored records: the few fields a reader needs, nothing decoded whole.

A PULL answer is a concatenation of stored records (docs/protocol.md §7). A reader that
needs only the commitlog offset, the body and the properties (the MQTT gateway rebuilding a
PUBLISH from topic, QoS and payload) takes them here, skipping the hosts, timestamps,
checksums and the `MessageExt` that `decode_record` builds for every record. The layout is
validated as `decode_record` validates it (`parse_layout`); nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from core.common.codec import INT64, OFF_PHYSICAL_OFFSET, parse_layout

__all__ = ["RecordView", "iter_record_views"]


class RecordView(NamedTuple):
    """The fields of one stored record a light reader needs."""

    commitlog_offset: int
    sys_flag: int
    body: bytes
    #: the raw properties string (UTF-8, RocketMQ \\x01 / \\x02 separators)
    properties: bytes


def iter_record_views(buf: bytes | bytearray | memoryview) -> Iterator[RecordView]:
    """The records of `buf` in order (raises `RecordError` on a malformed one)."""
    mv = memoryview(buf)
    pos = 0
    end = len(mv)
    unpack = INT64.unpack_from
    while pos < end:
        lay = parse_layout(mv, pos)
        body = lay.body_start
        props = lay.properties_start
        yield RecordView(
            unpack(mv, pos + OFF_PHYSICAL_OFFSET)[0],
            lay.sys_flag,
            bytes(mv[body : body + lay.body_length]),
            bytes(mv[props : props + lay.properties_length]),
        )
        pos += lay.total_size
