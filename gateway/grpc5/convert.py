"""Messages between the gRPC model (apache.rocketmq.v2.Message) and the stored 4.x model
(properties on a record), both ways, as Apache's proxy maps them (docs/grpc.md
"Message mapping"). Pure functions; they run on the gRPC thread, not the trio loop.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass

from core.broker.config import DEFAULT_DELAY_LEVELS
from core.broker.schedule import TIMER_DELAY_MS, TIMER_DELAY_SEC, parse_delay_levels
from core.common.message import MessageExt
from core.common.properties import MAX_PROPERTIES_BYTES, MessageConst, encode_properties
from gateway.grpc5.config import GrpcConfig
from gateway.grpc5.proto import messaging_pb2 as pb

__all__ = ["GrpcError", "OutgoingMessage", "from_grpc", "to_grpc", "wrap", "unwrap",
           "SHARDING_KEY", "LITE_TOPIC", "DELIVER_MS"]

#: Java's MessageConst.PROPERTY_SHARDING_KEY: the FIFO message group.
SHARDING_KEY = "__SHARDINGKEY"
#: The lite topic of a message (RIP-83).
LITE_TOPIC = "__LITE_TOPIC"
#: The delivery time the producer asked for, in ms (Apache's timer property name).
DELIVER_MS = "TIMER_DELIVER_MS"

_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)

#: Property names a client may not set as user properties: what the broker or the
#: mapping below writes (a producer could otherwise forge a delivery count, a receipt
#: handle or an LMQ dispatch).
_RESERVED = frozenset({
    v for k, v in vars(MessageConst).items()
    if k.isupper() and isinstance(v, str) and len(v) > 1
} | {SHARDING_KEY, LITE_TOPIC, DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, "POP_CK",
     "__STARTDELIVERTIME"})


class GrpcError(Exception):
    """A request refused with a RocketMQ 5 status code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def wrap(namespace: str, name: str) -> str:
    """Resource -> the broker's name: `<namespace>%<name>` (RocketMQ's NamespaceUtil)."""
    return f"{namespace}%{name}" if namespace else name


def unwrap(namespace: str, name: str) -> str:
    if namespace and name.startswith(namespace + "%"):
        return name[len(namespace) + 1:]
    return name


@dataclass(slots=True)
class OutgoingMessage:
    """A message ready for SEND_MESSAGE_V2."""

    topic: str
    properties: dict[str, str]
    body: bytes
    born_ms: int
    message_id: str
    message_type: int
    message_group: str | None
    transactional: bool
    #: The MQTT topic of MQTT traffic (gateway/grpc5/mqtt_out.py), else None.
    mqtt_topic: str | None = None


def _check_text(value: str, what: str, code: int, limit: int) -> None:
    if not value.strip() or len(value) > limit or "\x01" in value or "\x02" in value:
        raise GrpcError(code, f"illegal {what}")


def _delay_level(delay_ms: int, max_delay_ms: int) -> int:
    """A DELAY level marking the message as scheduled (0 for none, i.e. already due).

    The broker cascades it through its levels to the exact `TIMER_DELIVER_MS`
    (core/broker/schedule.py), so the level itself is only a hint: the largest default
    level not longer than the delay (1 when none is). ILLEGAL_DELIVERY_TIME beyond
    `max_delay_ms` (`timer_max_delay_s`).
    """
    if delay_ms <= 0:
        return 0
    if delay_ms > max_delay_ms:
        raise GrpcError(pb.ILLEGAL_DELIVERY_TIME,
                        f"delivery time more than {max_delay_ms // 1000} s ahead")
    return max(1, bisect.bisect_right(_DELAY_LEVELS_MS, delay_ms))


def from_grpc(msg: pb.Message, config: GrpcConfig, now_ms: int) -> OutgoingMessage:
    """Validate a client's message and map it to stored properties; GrpcError if bad."""
    sp = msg.system_properties
    topic = msg.topic.name
    if not topic:
        raise GrpcError(pb.ILLEGAL_TOPIC, "topic is empty")
    topic = wrap(msg.topic.resource_namespace, topic)
    body = msg.body
    if not body:
        raise GrpcError(pb.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > config.max_body_size:
        raise GrpcError(pb.MESSAGE_BODY_TOO_LARGE,
                        f"message body exceeds {config.max_body_size} bytes")
    if sp.body_encoding == pb.GZIP:
        raise GrpcError(pb.BAD_REQUEST, "compressed message bodies are not accepted")
    if not sp.message_id or len(sp.message_id) > 128:
        raise GrpcError(pb.ILLEGAL_MESSAGE_ID, "message id is empty or too long")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in _RESERVED:
            raise GrpcError(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {key!r} is reserved")
        _check_text(key, "property key", pb.ILLEGAL_MESSAGE_PROPERTY_KEY, 1024)
        if "\x01" in value or "\x02" in value:
            raise GrpcError(pb.BAD_REQUEST, f"illegal value of property {key!r}")
        props[key] = value
    props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    if sp.HasField("tag"):
        _check_text(sp.tag, "tag", pb.ILLEGAL_MESSAGE_TAG, 1024)
        if "|" in sp.tag:
            raise GrpcError(pb.ILLEGAL_MESSAGE_TAG, "a tag may not contain '|'")
        props[MessageConst.TAGS] = sp.tag
    if sp.keys:
        for key in sp.keys:
            _check_text(key, "message key", pb.ILLEGAL_MESSAGE_KEY, 1024)
            if " " in key:
                raise GrpcError(pb.ILLEGAL_MESSAGE_KEY, "a message key may not contain spaces")
        props[MessageConst.KEYS] = " ".join(sp.keys)
    mtype = sp.message_type
    group = sp.message_group if sp.HasField("message_group") else None
    delivery_ms = None
    if sp.HasField("delivery_timestamp"):
        ts = sp.delivery_timestamp
        delivery_ms = ts.seconds * 1000 + ts.nanos // 1_000_000
    transactional = mtype == pb.TRANSACTION
    if mtype == pb.FIFO and not group:
        raise GrpcError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "FIFO message without a group")
    if mtype == pb.DELAY and delivery_ms is None:
        raise GrpcError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "DELAY message without a delivery timestamp")
    if mtype in (pb.NORMAL, pb.TRANSACTION) and (group or delivery_ms is not None):
        raise GrpcError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "a NORMAL or TRANSACTION message has neither group nor delivery time")
    lite = sp.lite_topic if sp.HasField("lite_topic") else None
    if (mtype == pb.LITE) != (lite is not None) or (lite is not None and (
            group or delivery_ms is not None)):
        raise GrpcError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        "a LITE message has a lite topic and neither group nor delivery time")
    if mtype not in (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION, pb.LITE):
        raise GrpcError(pb.UNSUPPORTED, f"message type {mtype} is not supported")
    if lite is not None:
        from gateway.grpc5.lite import check_lite_topic, lmq_name

        check_lite_topic(lite, config.max_lite_topic_size)
        props[LITE_TOPIC] = lite
        # The broker indexes it into the lite topic's LMQ (docs/grpc.md "Lite topics").
        props[MessageConst.INNER_MULTI_DISPATCH] = lmq_name(topic, lite)
    if group is not None:
        _check_text(group, "message group", pb.ILLEGAL_MESSAGE_GROUP,
                    config.max_message_group_length)
        props[SHARDING_KEY] = group
    if delivery_ms is not None:
        if delivery_ms < 0:
            raise GrpcError(pb.ILLEGAL_DELIVERY_TIME, "delivery time before 1970")
        level = _delay_level(delivery_ms - now_ms, 1000 * config.timer_max_delay_s)
        props[DELIVER_MS] = str(delivery_ms)
        if level:
            props[MessageConst.DELAY_TIME_LEVEL] = str(level)
    if transactional:
        props[MessageConst.TRANSACTION_PREPARED] = "true"
        props[MessageConst.PRODUCER_GROUP] = topic
    if len(encode_properties(props).encode("utf-8")) > MAX_PROPERTIES_BYTES:
        raise GrpcError(pb.MESSAGE_PROPERTIES_TOO_LARGE,
                        f"properties exceed {MAX_PROPERTIES_BYTES} bytes")
    born_ms = sp.born_timestamp.ToMilliseconds() if sp.HasField("born_timestamp") else now_ms
    return OutgoingMessage(topic, props, body, born_ms, sp.message_id, mtype, group,
                           transactional)


def _host(addr: str) -> str:
    return addr.rsplit(":", 1)[0] if ":" in addr else addr


def to_grpc(m: MessageExt, namespace: str, *, topic: str | None = None,
            handle: str | None = None, invisible_ms: int | None = None) -> pb.Message:
    """A stored message as the client sees it (`topic` for LMQ pops: the parent topic)."""
    props = m.properties
    out = pb.Message()
    out.topic.resource_namespace = namespace
    out.topic.name = unwrap(namespace, topic or m.topic)
    for key, value in props.items():
        if key not in _RESERVED:
            out.user_properties[key] = value
    body = bytes(m.body)
    out.body = body
    sp = out.system_properties
    sp.message_id = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or m.msg_id
    if MessageConst.TAGS in props:
        sp.tag = props[MessageConst.TAGS]
    if props.get(MessageConst.KEYS):
        sp.keys.extend(k for k in props[MessageConst.KEYS].split(" ") if k)
    sp.body_digest.type = pb.CRC32
    sp.body_digest.checksum = format(zlib.crc32(body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = pb.IDENTITY
    group = props.get(SHARDING_KEY)
    if props.get(LITE_TOPIC):
        sp.message_type = pb.LITE
        sp.lite_topic = props[LITE_TOPIC]
    elif group:
        sp.message_type = pb.FIFO
    elif DELIVER_MS in props or MessageConst.DELAY_TIME_LEVEL in props:
        sp.message_type = pb.DELAY
    elif MessageConst.TRANSACTION_PREPARED in props:
        sp.message_type = pb.TRANSACTION
    else:
        sp.message_type = pb.NORMAL
    if group:
        sp.message_group = group
    sp.born_timestamp.FromMilliseconds(m.born_timestamp)
    sp.born_host = _host(m.born_host)
    sp.store_timestamp.FromMilliseconds(m.store_timestamp)
    sp.store_host = m.store_host
    if props.get(DELIVER_MS, "").isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(props[DELIVER_MS]))
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    sp.delivery_attempt = m.reconsume_times + 1
    if handle is not None:
        sp.receipt_handle = handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    return out
