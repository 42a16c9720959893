"""The per-message byte work of the broker link's store request (broker_link.py `_send`):
the stored properties of its messages (StoredProperties), the batch body and the
offsets of the answer, one C call each (core/_speedups.c
batch_body / offset_ids) when the extension is built, else the Python below, which is
the reference the C is tested against (tests/gateway/mqtt/test_store_request.py).
LMQ_PURE_PYTHON=1 uses the Python anyway."""

from __future__ import annotations

import os
from string import hexdigits
from typing import TYPE_CHECKING

from core.broker.processors.send import SendHeader
from core.common.codec import BATCH_HEAD
from core.common.codec import INT16 as _INT16
from core.common.properties import MessageConst, encode_properties
from gateway.mqtt.message import MqttMessage, lmq_dispatch_value, to_properties
from gateway.mqtt.packets import NO_PROPERTIES

if TYPE_CHECKING:
    from gateway.mqtt.broker_link import _Request

__all__ = ["PROPERTIES_MEMO", "StoredProperties", "batch_body", "batch_body_py", "local_header",
           "offset_ids", "offset_ids_py", "request_ext"]

#: Memoized properties strings of simple messages (see StoredProperties.of).
PROPERTIES_MEMO = 65536

#: The producer group and default topic of the gateway's store requests.
STORE_GROUP = "MQTT_GATEWAY"
STORE_DEFAULT_TOPIC = "TBW102"

_SUB_FIXED = BATCH_HEAD.size + 2  # a batch sub-message: header + properties length
_HEX = frozenset(hexdigits)


class StoredProperties:
    """The stored properties string of a message (to_properties + INNER_MULTI_DISPATCH,
    UTF-8). A message with no v5 properties and no expiry is described by its topic,
    QoS, retain flag, sender and LMQs alone, and publishers repeat those: such strings
    are memoized (at most PROPERTIES_MEMO entries, then the memo starts over)."""

    def __init__(self) -> None:
        self._memo: dict[tuple, bytes] = {}

    def of(self, msg: MqttMessage, lmqs) -> bytes:
        simple = msg.props is NO_PROPERTIES and msg.expiry_at is None
        if simple:
            key = (msg.topic, msg.qos, msg.retain, msg.sender,
                   lmqs if type(lmqs) is tuple else tuple(lmqs))
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        props = to_properties(msg)
        if lmqs:
            props[MessageConst.INNER_MULTI_DISPATCH] = lmq_dispatch_value(lmqs)
        pb = encode_properties(props).encode()
        if simple:
            memo = self._memo
            if len(memo) >= PROPERTIES_MEMO:
                memo.clear()
            memo[key] = pb
        return pb

    def request(self, reqs: list[_Request]) -> tuple[str, bytes, bool]:
        """(properties string, body, batch) of a store request of `reqs`: one message
        with its properties in the header, or a batch body (docs/protocol.md §7.7) with
        one header, the payload and the (memoized) properties per message, framed in
        one call."""
        if len(reqs) == 1:
            req = reqs[0]
            return self.of(req.msg, req.lmqs).decode(), bytes(req.msg.payload), False
        payloads, props = self.parts(reqs)
        try:
            body = batch_body(payloads, props)
        except TypeError:  # a payload not of type bytes (the C takes bytes only)
            body = batch_body_py(payloads, props)
        return "", body, True

    def parts(self, reqs: list[_Request]) -> tuple[list[bytes], list[bytes]]:
        """The payloads and properties strings of a batch's requests. A run of one
        publisher's simple messages of one route (one topic, QoS, retain flag, sender
        and LMQs) has one properties string: looked up once per run."""
        payloads: list[bytes] = []
        props: list[bytes] = []
        run = lmqs = None
        pb = b""
        for req in reqs:
            msg = req.msg
            payloads.append(msg.payload)
            if (run is None or msg.topic is not run.topic or req.lmqs is not lmqs
                    or msg.sender is not run.sender or msg.qos != run.qos
                    or msg.retain != run.retain or msg.props is not NO_PROPERTIES
                    or msg.expiry_at is not None):
                pb = self.of(msg, req.lmqs)
                run = msg if msg.props is NO_PROPERTIES and msg.expiry_at is None else None
                lmqs = req.lmqs
            props.append(pb)
        return payloads, props


def batch_body_py(payloads: list[bytes], props: list[bytes]) -> bytes:
    """A batch body (docs/protocol.md §7.7): per message a header, the payload and its
    properties string."""
    if len(payloads) != len(props):
        raise ValueError("batch_body: payloads and props differ in length")
    parts = []
    add = parts.append
    head = BATCH_HEAD.pack
    for payload, pb in zip(payloads, props, strict=True):
        if len(pb) > 32767:
            raise ValueError("batch_body: a size does not fit the format")
        add(head(_SUB_FIXED + len(payload) + len(pb), 0, 0, 0, len(payload)))
        add(payload)
        add(_INT16.pack(len(pb)))
        add(pb)
    return b"".join(parts)


def offset_ids_py(ids: str, n: int) -> list[int] | None:
    """The commitlog offsets of `n` offset msgIds joined by commas (the last 16 hex
    digits of each), or None when there are not `n` of them or one is malformed."""
    parts = ids.split(",")
    if n < 1 or len(parts) != n:
        return None
    out = []
    for part in parts:
        tail = part[-16:]
        if len(tail) != 16 or not _HEX.issuperset(tail):
            return None
        out.append(int(tail, 16))
    return out


batch_body = batch_body_py
offset_ids = offset_ids_py
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import batch_body, offset_ids  # noqa: F811
    except ImportError:
        pass


def request_ext(config, qid: int, props: str, batch: bool, born_ms: int) -> dict[str, str]:
    """The header fields of the gateway's SEND_BATCH_MESSAGE / SEND_MESSAGE_V2."""
    return {
        "a": STORE_GROUP, "b": config.store_topic, "c": STORE_DEFAULT_TOPIC,
        "d": str(config.store_queues), "e": str(qid), "f": "0", "g": str(born_ms), "h": "0",
        "i": props, "j": "0", "k": "false", "m": "true" if batch else "false",
    }


def local_header(config, qid: int, props: str, batch: bool, born_ms: int) -> SendHeader:
    """The header of a store request sent in process (core/broker/local_send.py): the
    fields BrokerLink's SEND_BATCH_MESSAGE / SEND_MESSAGE_V2 carries, as values."""
    return SendHeader(STORE_GROUP, config.store_topic, STORE_DEFAULT_TOPIC, config.store_queues,
                      qid, 0, born_ms, 0, props, 0, False, None, batch)
