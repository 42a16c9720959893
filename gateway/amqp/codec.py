"""Sans-IO AMQP 0-9-1 frame codec: bytes in -> events out, events in -> bytes out.

Wire layout (spec sections 4.2.2-4.2.7):
  protocol header  "AMQP" 0 0 9 1, sent once by the client before any frame
  frame            type:uint8 channel:uint16 size:uint32 payload[size] frame-end:0xCE
  types            1 method, 2 content header, 3 content body, 8 heartbeat (channel 0, empty)

A content-bearing method (basic.publish; basic.deliver/return/get-ok towards a client) is
followed on its channel by one content header and as many body frames as the header's
body size needs. Frames of other channels may come in between, never frames of the same
channel. `AmqpDecoder` assembles the three into one `Content` event.

Limits, each enforced before anything is buffered:
  frame_max          a frame larger than this (header and end octet included) by more
                     than FRAME_SIZE_TOLERANCE is a 501 frame error; until Tune-Ok it
                     is the spec's minimum, 4096.
  max_message_size   a content header announcing a larger body closes the channel with
                     406 (RabbitMQ's answer); its frames are then skipped.
  max_buffered_content  partial bodies of all channels together; beyond it 506.
So one connection holds at most one partial frame plus `max_buffered_content` octets.

Faults: `BadProtocolHeader` (reply with `PROTOCOL_HEADER`, then close), `AmqpError` with
the reply code for Connection.Close (501 frame, 502 syntax, 505 unexpected frame,
506 resource, 540 unknown method). After such a fault the decoder stays failed.
A channel-level fault does not stop decoding; it comes out as a `ChannelFault` event.
"""

from __future__ import annotations

import struct
from typing import Any, Literal, NamedTuple

from gateway.amqp.errors import (
    FRAME_ERROR,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
    UNEXPECTED_FRAME,
    AmqpError,
    BadProtocolHeader,
)
from gateway.amqp.fields import decode_shortstr, encode_shortstr
from gateway.amqp.methods import BasicAck, BasicDeliver, BasicPublish, Method, decode_method
from gateway.amqp.properties import (
    EMPTY_PROPERTIES,
    PROPERTIES_MEMO,
    BasicProperties,
    decode_properties,
    encode_properties,
)
from gateway.amqp.publish_scan import scan_publishes

__all__ = [
    "AmqpDecoder",
    "Content",
    "ChannelFault",
    "Heartbeat",
    "MethodFrame",
    "ProtocolHeader",
    "PROTOCOL_HEADER",
    "encode_method_frame",
    "encode_content",
    "encode_deliver",
    "deliver_head",
    "deliver_parts",
    "deliver_tail",
    "HEARTBEAT_FRAME",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
#: Frame header (7) + frame-end octet (1).
FRAME_OVERHEAD = 8
#: Octets a frame may exceed frame_max by: RabbitMQ tolerates 8 (clients that forget the
#: frame header and end octet in their arithmetic), and so do we.
FRAME_SIZE_TOLERANCE = 8
#: Spec's frame-min-size: every peer accepts frames this large, also before Tune.
FRAME_MIN_SIZE = 4096
#: Advertised in Connection.Tune; RabbitMQ's default (128 KiB).
DEFAULT_FRAME_MAX = 131072
#: RabbitMQ 4's default max_message_size (16 MiB); its hard ceiling is 512 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: Partially received bodies of all channels of one connection together.
DEFAULT_MAX_BUFFERED_CONTENT = 64 * 1024 * 1024

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
_METHOD_IDS = struct.Struct(">HH")
_PUBLISH_IDS = _METHOD_IDS.pack(60, 40)
_ACK_IDS = _METHOD_IDS.pack(60, 80)
_TICKET = struct.Struct(">H")
_DELIVER_TAG = struct.Struct(">QB")
# A frame's end octet followed by the next frame's head (and, for a content header, its
# class, weight and body size): one pack instead of three on the delivery path.
_END_HEADER_HEAD = struct.Struct(">BBHIHHQ")
_END_BODY_HEAD = struct.Struct(">BBHI")


class ProtocolHeader(NamedTuple):
    """The client's protocol header was received and is AMQP 0-9-1."""


class Heartbeat(NamedTuple):
    """A heartbeat frame: the peer is alive."""


class MethodFrame(NamedTuple):
    """A method without content (everything but publish/deliver/return/get-ok)."""

    channel: int
    method: Method


class Content(NamedTuple):
    """A content-bearing method with its properties and body, assembled from its frames.

    `raw_properties` is the flags and property list as received, to pass through unchanged
    (e.g. from basic.publish to basic.deliver) without re-encoding.
    """

    channel: int
    method: Method
    properties: BasicProperties
    raw_properties: bytes
    body: bytes


class ChannelFault(NamedTuple):
    """A fault that closes only `channel` (Channel.Close with `error.reply_code`)."""

    channel: int
    error: AmqpError


class _Pending:
    """A content being received on one channel."""

    __slots__ = ("method", "properties", "raw", "size", "parts", "received", "discard")

    def __init__(self, method: Method) -> None:
        self.method = method
        self.properties: BasicProperties | None = None
        self.raw = b""
        self.size = -1  # body size, -1 until the header came
        self.parts: list[bytes] = []
        self.received = 0
        self.discard = False


def _decode_publish(payload: bytes) -> BasicPublish:
    """basic.publish without the generic table walk: ticket, two short strings, one bit octet."""
    if len(payload) < 9:
        return decode_method(payload)  # raises the precise syntax error
    try:
        exchange, off = decode_shortstr(payload, 6)
        routing_key, off = decode_shortstr(payload, off)
    except AmqpError as exc:
        exc.class_id, exc.method_id = 60, 40
        raise
    if off + 1 != len(payload):
        return decode_method(payload)
    bits = payload[off]
    return BasicPublish(_TICKET.unpack_from(payload, 4)[0], exchange, routing_key,
                        bool(bits & 1), bool(bits & 2))


class AmqpDecoder:
    """Incremental frame decoder for one connection.

    `feed(data)` returns the events completed by `data`. `role="server"` expects the
    protocol header first; `role="client"` starts with frames. `frame_max` may be raised
    by the connection once Tune-Ok is received.
    """

    __slots__ = ("frame_max", "max_message_size", "max_buffered_content", "_role",
                 "_buf", "_need", "_header_done", "_pending", "_buffered", "_failed")

    def __init__(
        self,
        role: Literal["server", "client"] = "server",
        frame_max: int = FRAME_MIN_SIZE,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_buffered_content: int = DEFAULT_MAX_BUFFERED_CONTENT,
    ) -> None:
        self.frame_max = frame_max
        self.max_message_size = max_message_size
        self.max_buffered_content = max_buffered_content
        self._role = role
        self._buf = bytearray()
        self._need = 0  # octets `_buf` must hold before parsing is worth trying again
        self._header_done = role == "client"
        self._pending: dict[int, _Pending] = {}
        self._buffered = 0
        self._failed: AmqpError | None = None

    @property
    def buffered(self) -> int:
        """Octets held: the partial frame plus partial bodies."""
        return len(self._buf) + self._buffered

    def feed(self, data: bytes) -> list[Any]:
        if self._failed is not None:
            raise self._failed
        try:
            return self._feed(data)
        except AmqpError as exc:
            self._failed = exc
            self._buf = bytearray()
            self._pending.clear()
            raise

    def _feed(self, data: bytes) -> list[Any]:
        events: list[Any] = []
        if self._buf:
            # A partial frame is only parsed again once it can be complete, so a frame
            # trickling in octet by octet costs O(size), not O(size**2).
            self._buf += data
            if len(self._buf) < self._need:
                return events
            buf = bytes(self._buf)
            self._buf = bytearray()
        else:
            buf = data if type(data) is bytes else bytes(data)
        pos = 0
        if not self._header_done:
            have = buf[:8]
            if have != PROTOCOL_HEADER[: len(have)]:
                raise BadProtocolHeader(bytes(have), PROTOCOL_HEADER)
            if len(have) < 8:
                self._buf = bytearray(buf)
                self._need = 8
                return events
            self._header_done = True
            events.append(ProtocolHeader())
            pos = 8
        end = len(buf)
        limit = self.frame_max - FRAME_OVERHEAD + FRAME_SIZE_TOLERANCE
        while end - pos >= 7:
            kind, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
            if size > limit:
                raise AmqpError(FRAME_ERROR, f"frame of {size + FRAME_OVERHEAD} octets exceeds "
                                f"frame_max {self.frame_max}")
            stop = pos + 7 + size
            if stop >= end:
                break  # frame-end octet not here yet
            if buf[stop] != FRAME_END:
                raise AmqpError(FRAME_ERROR, f"frame-end octet {buf[stop]:#04x}, expected 0xce")
            if kind == FRAME_METHOD and channel and buf[pos + 7:pos + 11] == _PUBLISH_IDS and \
                    channel not in self._pending:
                run, after = scan_publishes(buf, pos, limit, self.max_message_size,
                                            self._pending, PROPERTIES_MEMO, Content,
                                            BasicPublish)
                if run:  # the common publishes of this read in one call (publish_scan.py)
                    events += run
                    pos = after
                    continue
                whole = self._whole_publish(buf, pos + 7, stop, end, channel, limit)
                if whole is not None:
                    events.append(whole[0])
                    pos = whole[1]
                    continue
            payload = buf[pos + 7:stop]
            pos = stop + 1
            if kind == FRAME_BODY:
                event = self._body(channel, payload)
            elif kind == FRAME_METHOD:
                event = self._method(channel, payload)
            elif kind == FRAME_HEADER:
                event = self._header(channel, payload)
            elif kind == FRAME_HEARTBEAT:
                if channel != 0 or size != 0:
                    raise AmqpError(FRAME_ERROR, "heartbeat frame must be empty, on channel 0")
                event = Heartbeat()
            else:
                raise AmqpError(FRAME_ERROR, f"unknown frame type {kind}")
            if event is not None:
                events.append(event)
        if pos < end:
            self._buf = bytearray(buf[pos:])
            self._need = 7 if end - pos < 7 else 8 + _FRAME_HEAD.unpack_from(buf, pos)[2]
        return events

    def _whole_publish(self, buf: bytes, start: int, stop: int, end: int, channel: int,
                       limit: int) -> tuple[Content, int] | None:
        """A basic.publish whose content header and single body frame follow it in `buf`,
        decoded in one go (the common case: no `_Pending` state); None for anything else,
        which the frame-by-frame path then takes (and reports any error of)."""
        h = stop + 1  # the content header frame
        if end - h < 7:
            return None
        kind, ch, size = _FRAME_HEAD.unpack_from(buf, h)
        hstop = h + 7 + size
        if kind != FRAME_HEADER or ch != channel or size < 14 or size > limit or \
                hstop >= end or buf[hstop] != FRAME_END:
            return None
        class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(buf, h + 7)
        if class_id != 60 or body_size > self.max_message_size:
            return None
        if body_size:
            b = hstop + 1  # the body frame
            if end - b < 7:
                return None
            kind, ch, size = _FRAME_HEAD.unpack_from(buf, b)
            bstop = b + 7 + body_size
            if kind != FRAME_BODY or ch != channel or size != body_size or \
                    size > limit or bstop >= end or buf[bstop] != FRAME_END:
                return None
            body = buf[b + 7:bstop]
            after = bstop + 1
        else:
            body = b""
            after = hstop + 1
        method = _decode_publish(buf[start:stop])
        raw = buf[h + 19:hstop]
        return Content(channel, method, decode_properties(raw), raw, body), after

    def _method(self, channel: int, payload: bytes) -> Any:
        if channel in self._pending:
            raise AmqpError(UNEXPECTED_FRAME, f"method frame on channel {channel} while "
                            "its content was expected")
        ids = payload[:4]
        if ids == _ACK_IDS and len(payload) == 13:  # basic.ack: a consumer's, per message
            tag, bits = _DELIVER_TAG.unpack_from(payload, 4)
            return MethodFrame(channel, BasicAck(tag, bool(bits & 1)))
        method = _decode_publish(payload) if ids == _PUBLISH_IDS else decode_method(payload)
        if not method.HAS_CONTENT:
            return MethodFrame(channel, method)
        if channel == 0:
            raise AmqpError(UNEXPECTED_FRAME, f"{method.NAME} on channel 0",
                            class_id=method.CLASS_ID, method_id=method.METHOD_ID)
        self._pending[channel] = _Pending(method)
        return None

    def _header(self, channel: int, payload: bytes) -> Any:
        pending = self._pending.get(channel)
        if pending is None or pending.size >= 0:
            raise AmqpError(UNEXPECTED_FRAME, f"unexpected content header on channel {channel}")
        if len(payload) < 14:
            raise AmqpError(FRAME_ERROR, "content header too short")
        class_id, _weight, size = _CONTENT_HEAD.unpack_from(payload, 0)
        method = pending.method
        if class_id != method.CLASS_ID:
            raise AmqpError(UNEXPECTED_FRAME, f"content header of class {class_id} after "
                            f"{method.NAME}")
        raw = payload[12:]
        properties = decode_properties(raw)
        pending.size = size
        if size > self.max_message_size:
            pending.discard = True
            return ChannelFault(channel, AmqpError(
                PRECONDITION_FAILED, f"message size {size} is larger than the maximum "
                f"{self.max_message_size}", channel, method.CLASS_ID, method.METHOD_ID))
        if size == 0:
            del self._pending[channel]
            return Content(channel, method, properties, raw, b"")
        pending.properties = properties
        pending.raw = raw
        return None

    def _body(self, channel: int, payload: bytes) -> Any:
        pending = self._pending.get(channel)
        if pending is None or pending.size < 0:
            raise AmqpError(UNEXPECTED_FRAME, f"unexpected content body on channel {channel}")
        received = pending.received + len(payload)
        if received > pending.size:
            raise AmqpError(UNEXPECTED_FRAME, f"content body on channel {channel} longer "
                            f"than its header's {pending.size} octets")
        pending.received = received
        if pending.discard:
            if received == pending.size:
                del self._pending[channel]
            return None
        if received == pending.size:
            del self._pending[channel]
            if pending.parts:
                self._buffered -= received - len(payload)
                pending.parts.append(payload)
                body = b"".join(pending.parts)
            else:
                body = payload
            assert pending.properties is not None
            return Content(channel, pending.method, pending.properties, pending.raw, body)
        self._buffered += len(payload)
        if self._buffered > self.max_buffered_content:
            raise AmqpError(RESOURCE_ERROR, f"more than {self.max_buffered_content} octets of "
                            "partial message bodies")
        pending.parts.append(payload)
        return None


# ---------------------------------------------------------------- encoding


def encode_frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(kind, channel, len(payload)) + payload + b"\xce"


def encode_method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def _content_frames(parts: list[bytes], channel: int, class_id: int,
                    raw_properties: bytes, body: bytes, frame_max: int) -> None:
    head = _CONTENT_HEAD.pack(class_id, 0, len(body))
    parts.append(_FRAME_HEAD.pack(FRAME_HEADER, channel, 12 + len(raw_properties)))
    parts.append(head)
    parts.append(raw_properties)
    parts.append(b"\xce")
    chunk = frame_max - FRAME_OVERHEAD
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start:start + chunk]
        parts.append(_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)))
        parts.append(piece)
        parts.append(b"\xce")


def encode_content(channel: int, method: Method, properties: BasicProperties | bytes,
                   body: bytes, frame_max: int = FRAME_MIN_SIZE) -> bytes:
    """Method, content header and body frames (each at most `frame_max` octets).

    `properties` may be already-encoded flags and property list (`Content.raw_properties`).
    """
    if frame_max < FRAME_MIN_SIZE:
        raise ValueError(f"frame_max below {FRAME_MIN_SIZE}")
    raw = properties if isinstance(properties, bytes) else encode_properties(properties)
    parts = [encode_method_frame(channel, method)]
    _content_frames(parts, channel, method.CLASS_ID, raw, body, frame_max)
    return b"".join(parts)


def deliver_head(consumer_tag: str) -> bytes:
    """basic.deliver's method ids and consumer tag: the same for every delivery of a
    consumer (`deliver_parts`)."""
    return _METHOD_IDS.pack(60, 60) + encode_shortstr(consumer_tag)


def deliver_tail(exchange: str, routing_key: str) -> bytes:
    """basic.deliver's exchange and routing key (`deliver_parts`)."""
    return encode_shortstr(exchange) + encode_shortstr(routing_key)


def deliver_parts(parts: list, channel: int, head: bytes, delivery_tag: int,
                  redelivered: bool, tail: bytes, raw_properties: bytes, body: bytes,
                  frame_max: int) -> None:
    """Append basic.deliver with its content to `parts` (hot path: no method table, the
    constant pieces pre-encoded, the body not copied until the caller joins the parts of
    all its deliveries once)."""
    raw = raw_properties or EMPTY_PROPERTIES
    size = len(body)
    parts += (_FRAME_HEAD.pack(FRAME_METHOD, channel, len(head) + 9 + len(tail)), head,
              _DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0), tail,
              _END_HEADER_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(raw), 60, 0,
                                    size), raw)
    if 0 < size <= frame_max - FRAME_OVERHEAD:
        parts += (_END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size), body, b"\xce")
        return
    parts.append(b"\xce")
    chunk = frame_max - FRAME_OVERHEAD
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start:start + chunk]
        parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")


def encode_deliver(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                   exchange: str, routing_key: str, raw_properties: bytes, body: bytes,
                   frame_max: int) -> bytes:
    """basic.deliver with its content, built without the generic method table."""
    parts: list = []
    deliver_parts(parts, channel, deliver_head(consumer_tag), delivery_tag, redelivered,
                  deliver_tail(exchange, routing_key), raw_properties, body, frame_max)
    return b"".join(parts)


# Deliver's fields are laid out as in the method table; keep the two in step.
assert BasicDeliver._fields == ("consumer_tag", "delivery_tag", "redelivered", "exchange",
                                "routing_key")
