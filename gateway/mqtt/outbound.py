"""One delivery as bytes: the PUBLISH a session sends for a stored message.

3.1/3.1.1 PUBLISHes are built straight from the message's fields (no `Publish` object, no
codec); a QoS 0 one is the same for every session and is encoded once per message. v5
ones carry per-session fields (expiry left, subscription identifiers, topic aliases).
`merge_single_v3` queues a 3.x session's deliveries of one QoS 0/1 subscription, the
common case of a fan-in's subscriber, without the general merge's work per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.mqtt._encoding import publish_v3, publish_v3_head
from gateway.mqtt.message import MqttMessage, now_ms
from gateway.mqtt.packets import PacketTooLarge, Publish, Pubrel
from gateway.mqtt.session import Cursor, Inflight, Session

if TYPE_CHECKING:
    from gateway.mqtt.connection import Connection
    from gateway.mqtt.server import MqttGateway

__all__ = ["build_publish", "encode_publish", "merge_single_v3", "qos0_v3", "retransmit"]


def qos0_v3(msg: MqttMessage, retain: bool) -> bytes:
    """The 3.1/3.1.1 QoS 0 PUBLISH of `msg`: the same bytes for every such session, so
    encoded once per message (and RETAIN flag)."""
    if retain:
        data = msg.wire_retain
        if data is None:
            data = msg.wire_retain = publish_v3(msg.topic, msg.payload, 0, True, False, None)
        return data
    data = msg.wire
    if data is None:
        data = msg.wire = publish_v3(msg.topic, msg.payload, 0, False, False, None)
    return data


def build_publish(conn: Connection, msg: MqttMessage, qos: int, retain: bool,
                  sub_ids: tuple[int, ...], pid: int | None, dup: bool, now: int) -> Publish:
    """The PUBLISH for one delivery on `conn` (v5: expiry left, subscription ids, alias).

    A new topic alias is only proposed (topic and alias both set): `encode_publish`
    records it once the packet is encoded, i.e. will really reach the client.
    """
    topic = msg.topic
    if conn.version != 5:
        return Publish(topic, msg.payload, qos, retain, dup, pid)
    props = msg.props
    expiry = msg.remaining_expiry(now)
    alias = None
    if conn.alias_max:
        alias = conn.alias_out.get(topic)
        if alias is not None:
            topic = ""
        elif len(conn.alias_out) < conn.alias_max:
            alias = len(conn.alias_out) + 1
    if expiry is not None or sub_ids or alias is not None:
        from dataclasses import replace

        props = replace(props, message_expiry_interval=expiry, subscription_identifiers=sub_ids,
                        topic_alias=alias)
    return Publish(topic, msg.payload, qos, retain, dup, pid, props)


def encode_publish(conn: Connection, msg: MqttMessage, qos: int, retain: bool,
                   sub_ids: tuple[int, ...], pid: int | None, dup: bool, now: int) -> bytes:
    """Encode one delivery on `conn`; raises `PacketTooLarge` (client's Maximum Packet Size).

    A new outbound topic alias is recorded only after a successful encode: a discarded
    packet must not leave an alias the client never saw (the next PUBLISH would carry an
    empty topic with it, a protocol error on the client's side, v5 §3.3.2.3.4).
    """
    if conn.version != 5 and conn.codec.peer_max_packet_size is None:
        if qos:
            return publish_v3(msg.topic, msg.payload, qos, retain, dup, pid)
        return qos0_v3(msg, retain)
    packet = build_publish(conn, msg, qos, retain, sub_ids, pid, dup, now)
    data = conn.codec.encode(packet)
    if packet.topic and packet.properties.topic_alias is not None:
        conn.alias_out[packet.topic] = packet.properties.topic_alias
    return data


def merge_single_v3(sess: Session, conn: Connection, stats: Any, c: Cursor, now: int,
                    limit: int) -> int:
    """Pump._merge (delivery.py) for the common case of one QoS 0 or 1 subscription of a 3.x session,
    per message only what it needs: a QoS 0 delivery is a run's shared header and the
    message's own payload (no packet id, no in-flight entry, no copy); a QoS 1 one
    gets its in-flight entry and packet id, up to the in-flight limit."""
    buf = c.buf
    if not buf:
        return 0
    out = conn.out
    sub = c.sub
    granted = sub.qos
    keep = sub.retain_as_published
    sub_ids = (sub.sub_id,) if sub.sub_id is not None else ()
    inflight = sess.inflight
    window = conn.inflight_limit
    room = limit - conn.out_bytes
    queued = 0
    sent = 0
    last = -1
    head_topic, head_size, head = None, -1, b""
    while buf and queued < room:
        offset, msg = buf[0]
        qos = msg.qos if msg.qos < granted else granted
        if qos and len(inflight) >= window:
            break  # wait for an acknowledgement; order is kept
        buf.popleft()
        last = offset
        if msg.expiry_at is not None and now >= msg.expiry_at:
            continue  # expired (MQTT-3.3.2-5): consumed unsent
        retain = keep and msg.retain
        if qos:
            pid = sess.next_packet_id()
            inflight[pid] = Inflight(pid, 1, msg, [(c, offset)], retain, sub_ids)
            c.unacked.add(offset)
            data = publish_v3(msg.topic, msg.payload, 1, retain, False, pid)
        elif retain:
            data = qos0_v3(msg, True)
        else:
            # The PUBLISH is its fixed header and topic, the same for a run of one
            # publisher's messages (one topic, usually one size), then the payload
            # itself: queued as two parts, no copy per message (the write joins them).
            payload = msg.payload
            if msg.topic != head_topic or len(payload) != head_size:
                head_topic, head_size = msg.topic, len(payload)
                head = publish_v3_head(head_topic, head_size)
            out.append(head)
            out.append(payload)
            queued += len(head) + head_size
            sent += 1
            continue
        out.append(data)
        queued += len(data)
        sent += 1
    if last >= 0:
        c.sent = last + 1
        sess.dirty = True
    conn.out_bytes += queued
    stats.msgs_out += sent
    stats.bytes_out += queued
    return sent


async def retransmit(gw: MqttGateway, sess: Session, conn: Connection) -> None:
    """Resend every unacknowledged PUBLISH (DUP=1) and PUBREL of `sess` on `conn`, in
    order (§4.4); in-flight messages not loaded yet (after a restart) are read back."""
    if not sess.inflight:
        return
    now = now_ms()
    for pid, entry in list(sess.inflight.items()):
        if entry.state == "r":
            conn.queue(conn.codec.encode(Pubrel(pid)))
            continue
        msg = entry.msg
        if msg is None:
            msg = await gw.load_inflight_message(entry)
            if msg is None or sess.inflight.get(pid) is not entry:
                if sess.inflight.pop(pid, None) is entry:
                    sess.release(entry)
                continue
            entry.msg = msg
        try:
            data = encode_publish(conn, msg, entry.qos, entry.retain, entry.sub_ids, pid,
                                  True, now)
        except PacketTooLarge:
            sess.inflight.pop(pid, None)
            sess.release(entry)
            continue
        conn.queue(data)
    await conn.flush()
