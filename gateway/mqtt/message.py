"""An MQTT application message and its stored form on the regular topic.

A publish is stored once as a RocketMQ message (body = payload) on the gateway's store
topic; the MQTT metadata travels in message properties so that native consumers (and
Spark) read MQTT traffic as it is. Property values are text: RocketMQ separates pairs with
\\x01 / \\x02, so a text value holding either character (or binary data) is stored in
base64 under the key with a `64` suffix. The keys (docs/mqtt.md, "Stored form"):

    MQTT_TOPIC        topic name                   (MQTT_TOPIC64 when not text-safe)
    MQTT_QOS          QoS the publisher used: "0" | "1" | "2"
    MQTT_RETAIN       "1" when published with RETAIN
    MQTT_EXPIRY_AT    absolute expiry, ms since the epoch (v5 Message Expiry Interval)
    MQTT_PFI          v5 Payload Format Indicator ("1" = UTF-8)
    MQTT_CT           v5 Content Type              (MQTT_CT64)
    MQTT_RT           v5 Response Topic            (MQTT_RT64)
    MQTT_CD           v5 Correlation Data, base64
    MQTT_UP           v5 User Properties, base64 of a JSON list of [name, value] pairs
    MQTT_CLIENT       publisher's client id (v5 No Local)  (MQTT_CLIENT64)
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from core.common.message import MessageExt
from core.common.properties import MessageConst, decode_properties_bytes
from core.common.sysflag import MessageSysFlag
from core.store.record_view import RecordView
from gateway.mqtt.packets import NO_PROPERTIES, Properties

__all__ = ["MqttMessage", "from_message_ext", "from_record_view", "to_properties", "now_ms",
           "get_text", "int_or_none"]

K_TOPIC = "MQTT_TOPIC"
K_QOS = "MQTT_QOS"
K_RETAIN = "MQTT_RETAIN"
K_EXPIRY = "MQTT_EXPIRY_AT"
K_PFI = "MQTT_PFI"
K_CT = "MQTT_CT"
K_RT = "MQTT_RT"
K_CD = "MQTT_CD"
K_UP = "MQTT_UP"
K_CLIENT = "MQTT_CLIENT"

_QOS_TEXT = ("0", "1", "2")


def now_ms() -> int:
    return int(time.time() * 1000)


class _NoOffsets(Mapping):
    """The LMQ offsets of a message not read back from the store: none. Shared and
    read-only (a published message costs no dict: its LMQ offsets are the LMQ states'
    business, broker_link.py)."""

    __slots__ = ()
    __hash__ = object.__hash__

    def __getitem__(self, key: str) -> int:
        raise KeyError(key)

    def get(self, key: str, default=None):
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


NO_OFFSETS: Mapping[str, int] = _NoOffsets()


@dataclass(slots=True)
class MqttMessage:
    """One application message, as published and as delivered.

    `props` holds only the v5 properties that travel with the message (payload format,
    content type, response topic, correlation data, user properties); the expiry is
    `expiry_at` (absolute, ms) so that the remaining time can be forwarded.
    `broker` / `commitlog_offset` are set once it is stored; `lmq_offsets` (LMQ name ->
    offset) only on a message read back from the store (NO_OFFSETS otherwise).
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    props: Properties = NO_PROPERTIES
    expiry_at: int | None = None
    sender: str | None = None
    broker: str = ""
    commitlog_offset: int = -1
    lmq_offsets: Mapping[str, int] = NO_OFFSETS
    #: the encoded 3.1/3.1.1 QoS 0 PUBLISH without / with RETAIN, once built: every
    #: session on a filter sends the same bytes (outbound.qos0_v3)
    wire: bytes | None = field(default=None, compare=False, repr=False)
    wire_retain: bytes | None = field(default=None, compare=False, repr=False)

    def expired(self, now: int) -> bool:
        return self.expiry_at is not None and now >= self.expiry_at

    def remaining_expiry(self, now: int) -> int | None:
        """Seconds left for the forwarded Message Expiry Interval (at least 1)."""
        if self.expiry_at is None:
            return None
        return max(1, -(-(self.expiry_at - now) // 1000))


def _safe(text: str) -> bool:
    return "\x01" not in text and "\x02" not in text


def _put_text(out: dict[str, str], key: str, value: str | None) -> None:
    if not value:
        return  # RocketMQ drops empty values; an empty string is "absent" here too
    if _safe(value):
        out[key] = value
    else:
        out[key + "64"] = base64.b64encode(value.encode("utf-8")).decode("ascii")


def get_text(props: dict[str, str], key: str) -> str | None:
    """A text property stored plain (`key`) or base64 (`key` + "64"), or None."""
    value = props.get(key)
    if value is not None:
        return value
    raw = props.get(key + "64")
    if raw is None:
        return None
    try:
        return base64.b64decode(raw).decode("utf-8")
    except ValueError:
        return None


def to_properties(msg: MqttMessage) -> dict[str, str]:
    """RocketMQ message properties describing `msg` (see the module doc)."""
    out: dict[str, str] = {}
    topic = msg.topic
    if _safe(topic):
        out[K_TOPIC] = topic
    else:
        out[K_TOPIC + "64"] = base64.b64encode(topic.encode("utf-8")).decode("ascii")
    out[K_QOS] = _QOS_TEXT[msg.qos]
    if msg.retain:
        out[K_RETAIN] = "1"
    if msg.expiry_at is not None:
        out[K_EXPIRY] = str(msg.expiry_at)
    p = msg.props
    if p is not NO_PROPERTIES:
        if p.payload_format_indicator is not None:
            out[K_PFI] = str(p.payload_format_indicator)
        _put_text(out, K_CT, p.content_type)
        _put_text(out, K_RT, p.response_topic)
        if p.correlation_data:
            out[K_CD] = base64.b64encode(p.correlation_data).decode("ascii")
        if p.user_properties:
            raw = json.dumps([list(pair) for pair in p.user_properties]).encode("utf-8")
            out[K_UP] = base64.b64encode(raw).decode("ascii")
    _put_text(out, K_CLIENT, msg.sender)
    return out


def int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def from_properties(
    props: dict[str, str], payload: bytes, broker: str = "", commitlog_offset: int = -1
) -> MqttMessage | None:
    """Rebuild the MQTT message from stored properties; None if it is not one of ours."""
    topic = get_text(props, K_TOPIC)
    if not topic:
        return None
    qos = int_or_none(props.get(K_QOS)) or 0
    if qos not in (0, 1, 2):
        qos = 0
    pfi = int_or_none(props.get(K_PFI))
    ct = get_text(props, K_CT)
    rt = get_text(props, K_RT)
    cd = None
    up: tuple[tuple[str, str], ...] = ()
    raw_cd = props.get(K_CD)
    if raw_cd:
        try:
            cd = base64.b64decode(raw_cd)
        except ValueError:
            cd = None
    raw_up = props.get(K_UP)
    if raw_up:
        try:
            up = tuple((str(k), str(v)) for k, v in json.loads(base64.b64decode(raw_up)))
        except (ValueError, TypeError):
            up = ()
    v5 = NO_PROPERTIES
    if pfi is not None or ct or rt or cd is not None or up:
        v5 = Properties(
            payload_format_indicator=pfi if pfi in (0, 1) else None,
            content_type=ct,
            response_topic=rt,
            correlation_data=cd,
            user_properties=up,
        )
    return MqttMessage(
        topic=topic,
        payload=payload,
        qos=qos,
        retain=props.get(K_RETAIN) == "1",
        props=v5,
        expiry_at=int_or_none(props.get(K_EXPIRY)),
        sender=get_text(props, K_CLIENT),
        broker=broker,
        commitlog_offset=commitlog_offset,
    )


def from_message_ext(ext: MessageExt, broker: str) -> MqttMessage | None:
    """The MQTT message in a pulled record (None for a record not written by a gateway)."""
    msg = from_properties(ext.properties, ext.body, broker, ext.commitlog_offset)
    if msg is not None:
        msg.lmq_offsets = ext.lmq_offsets()
    return msg


def from_record_view(view: RecordView, broker: str) -> MqttMessage | None:
    """The MQTT message in a stored record read as a `RecordView` (the gateway's pulls):
    topic, QoS and payload straight from the record's body and properties, no MessageExt."""
    body = view.body
    if view.sys_flag & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            return None
    props = decode_properties_bytes(view.properties)
    msg = from_properties(props, body, broker, view.commitlog_offset)
    if msg is not None:
        names = props.get(MessageConst.INNER_MULTI_DISPATCH)
        offsets = props.get(MessageConst.INNER_MULTI_QUEUE_OFFSET)
        if names and offsets:
            sep = MessageConst.MULTI_DISPATCH_SEPARATOR
            try:
                msg.lmq_offsets = {n: int(o) for n, o in
                                   zip(names.split(sep), offsets.split(sep), strict=False)}
            except ValueError:
                pass
    return msg


def lmq_dispatch_value(lmqs: list[str]) -> str:
    """INNER_MULTI_DISPATCH value for a set of LMQ topics."""
    return MessageConst.MULTI_DISPATCH_SEPARATOR.join(lmqs)
