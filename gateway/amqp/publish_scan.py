"""A socket read's run of plain basic.publish triples decoded in one call (docs/amqp.md,
"The publish path in one call").

`scan_publishes(buf, pos, limit, max_message_size, pending, memo, content, publish)`
returns `(run, pos)`: the `content` (codec.Content) events of the consecutive publishes
that start at `pos`, each a method frame, a content header and at most one body frame,
all three complete in `buf`, and the position after the last one. It stops (leaving the
rest to `AmqpDecoder`'s frame-by-frame code, which stays the reference and reports every
error) at the first frame that is anything else:

* not a method frame on a channel > 0 carrying basic.publish, or a channel in `pending`
  (one with a content under way);
* a frame larger than `limit` octets of payload, or one whose end octet is not there yet
  or is not 0xCE;
* a method whose fields are not exactly ticket, two short strings and one bit octet;
* a content header that is not the next frame of the channel, shorter than 14 octets, of
  another class, or announcing more than `max_message_size` octets; a body not in exactly
  one frame right after it;
* properties that are not a key of `memo` (properties.PROPERTIES_MEMO: the decoded
  property lists without headers, filled by `decode_properties`).

The C version (core/_speedups.c, block s6-amqpub) is used unless the extension is missing
or LMQ_PURE_PYTHON=1; `scan_publishes_py` is its reference: tests decode random and
mutated streams with both and compare (tests/gateway/amqp/test_publish_scan.py).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["scan_publishes", "scan_publishes_py"]

_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
_TICKET = struct.Struct(">H")
_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # class 60, method 40
_FRAME_END = 0xCE


def scan_publishes_py(buf: bytes | bytearray, pos: int, limit: int, max_message_size: int,
                      pending: Any, memo: dict, content: Callable,
                      publish: Callable) -> tuple[list, int]:
    """The reference of the C `scan_publishes` (module doc)."""
    if not 0 <= pos <= len(buf):
        raise ValueError("scan_publishes: pos outside the buffer")
    run: list = []
    end = len(buf)
    while end - pos >= 7:
        kind, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        stop = pos + 7 + size
        if kind != 1 or not channel or size > limit or size < 9 or stop >= end or \
                buf[stop] != _FRAME_END or buf[pos + 7:pos + 11] != _PUBLISH_IDS or \
                channel in pending:
            break
        h = stop + 1  # the content header frame
        if end - h < 7:
            break
        kind, ch, hsize = _FRAME_HEAD.unpack_from(buf, h)
        hstop = h + 7 + hsize
        if kind != 2 or ch != channel or hsize < 14 or hsize > limit or hstop >= end or \
                buf[hstop] != _FRAME_END:
            break
        class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(buf, h + 7)
        if class_id != 60 or body_size > max_message_size:
            break
        after = hstop + 1
        if body_size:
            b = after  # the body frame
            if end - b < 7:
                break
            kind, ch, bsize = _FRAME_HEAD.unpack_from(buf, b)
            bstop = b + 7 + bsize
            if kind != 3 or ch != channel or bsize != body_size or bsize > limit or \
                    bstop >= end or buf[bstop] != _FRAME_END:
                break
            after = bstop + 1
        # ticket:uint16 exchange:shortstr routing_key:shortstr bits:octet, nothing more
        m = pos + 7
        x0 = m + 7
        x1 = x0 + buf[m + 6]
        if x1 >= stop:
            break
        k0 = x1 + 1
        k1 = k0 + buf[x1]
        if k1 + 1 != stop:
            break
        raw = bytes(buf[h + 19:hstop])
        props = memo.get(raw)
        if props is None:
            break
        bits = buf[k1]
        method = publish(_TICKET.unpack_from(buf, m + 4)[0],
                         bytes(buf[x0:x1]).decode("utf-8", "surrogateescape"),
                         bytes(buf[k0:k1]).decode("utf-8", "surrogateescape"),
                         bool(bits & 1), bool(bits & 2))
        body = bytes(buf[after - 1 - body_size:after - 1]) if body_size else b""
        run.append(content(channel, method, props, raw, body))
        pos = after
    return run, pos


scan_publishes: Callable[..., tuple[list, int]] = scan_publishes_py
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import scan_amqp_publishes as scan_publishes
    except ImportError:
        pass
