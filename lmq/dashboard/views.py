"""What the dashboard's JSON API reads: plain dicts built from the live server objects.

Every function here runs in the event loop, so each one does a bounded amount of work:
lists are pages of at most `MAX_PAGE` rows (`offset`/`limit`), a topic's queue table is cut
at `MAX_QUEUES_SHOWN`, the message browser returns at most `MAX_MESSAGES` records and
`MAX_BODY_PREVIEW` bytes of each body. Nothing is sorted that can grow without a bound of
its own (MQTT sessions and retained messages are listed in their dict order). The objects
are read, never changed (the actions are in `actions.py`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

MAX_PAGE = 200  # rows per list page
DEFAULT_PAGE = 50
MAX_QUEUES_SHOWN = 64  # queues of one topic in the topic view
MAX_MESSAGES = 32  # records per message-browser answer
MAX_BODY_PREVIEW = 2048  # body bytes shown per message
MAX_PAYLOAD_PREVIEW = 200  # retained payload bytes shown in the list
MAX_SCAN_GROUPS = 5000  # offset-table entries visited to build one group page


class BadRequest(ValueError):
    """A query parameter the API cannot use: answered with 400 and this text."""


def page_args(query: dict[str, str]) -> tuple[int, int]:
    """(offset, limit) from the query string, limit capped at MAX_PAGE."""
    offset = int_arg(query, "offset", 0)
    limit = int_arg(query, "limit", DEFAULT_PAGE)
    if offset < 0 or limit < 1:
        raise BadRequest("offset must be >= 0 and limit >= 1")
    return offset, min(limit, MAX_PAGE)


def int_arg(query: dict[str, str], name: str, default: int | None = None) -> int:
    text = query.get(name)
    if text is None or text == "":
        if default is None:
            raise BadRequest(f"missing parameter {name}")
        return default
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {text[:40]!r}") from None


def _page(rows: Iterable[Any], offset: int, limit: int) -> list[Any]:
    return list(itertools.islice(rows, offset, offset + limit))


def preview(data: bytes | None, limit: int) -> dict[str, Any]:
    """A body as text when it is UTF-8, else as hex; cut at `limit` bytes."""
    data = bytes(data or b"")
    cut = data[:limit]
    try:
        text, kind = cut.decode("utf-8"), "text"
    except UnicodeDecodeError:
        text, kind = cut.hex(" "), "hex"
    return {"size": len(data), "kind": kind, "text": text, "truncated": len(data) > limit}


# -- broker -----------------------------------------------------------------------------------

def broker_summary(broker) -> dict[str, Any]:
    s = broker.store.stats()
    cfg = broker.config
    return {
        "name": cfg.broker_name, "cluster": cfg.cluster_name, "addr": broker.broker_addr,
        "role": cfg.broker_role, "flush": cfg.flush, "data_dir": cfg.data_dir,
        "started": bool(broker.started), "uptime_s": int(time.time() - broker.boot_timestamp / 1000),
        "topics": len(broker.topic_config_manager.table),
        "groups_online": len(broker.consumer_manager.groups),
        "puts": s["puts"], "put_bytes": s["put_bytes"], "gets": s["get_msgs"],
        "commitlog_bytes": s["commitlog_max_offset"] - s["commitlog_min_offset"],
        "commitlog_files": s["commitlog_files"],
        "flush_lag_bytes": max(0, s["commitlog_max_offset"] - s["commitlog_flushed_offset"]),
        "consume_queues": s["consume_queues_loaded"], "lmqs": s["lmq_count"],
        "lmq_dispatches": s["lmq_dispatches"], "long_poll_waiters": broker.pull_hold_service.held,
    }


def namesrv_summary(ns) -> dict[str, Any]:
    routes = ns.routes
    now = time.monotonic()
    live = []
    for addr, info in itertools.islice(routes.broker_live_table.items(), MAX_PAGE):
        live.append({"addr": addr, "last_seen_s": round(now - info.last_update, 1),
                     "ha_addr": info.ha_server_addr})
    brokers = []
    for name, data in itertools.islice(routes.broker_addr_table.items(), MAX_PAGE):
        brokers.append({"name": name, "cluster": data.cluster,
                        "addrs": {str(i): a for i, a in sorted(data.broker_addrs.items())}})
    return {"port": ns.port, "topics": len(routes.topic_queue_table), "live": live,
            "brokers": brokers}


def topics_page(broker, query: dict[str, str]) -> dict[str, Any]:
    offset, limit = page_args(query)
    table = broker.topic_config_manager.table
    needle = query.get("q", "")
    names: Iterable[str] = sorted(table)  # bounded by the topic caps (docs/topics.md)
    if needle:
        names = [n for n in names if needle in n]
    names = list(names)
    store = broker.store
    rows = []
    for name in _page(names, offset, limit):
        tc = table.get(name)
        if tc is None:
            continue
        n = min(tc.queue_nums, MAX_QUEUES_SHOWN)
        messages = sum(store.max_offset(name, q) - store.min_offset(name, q) for q in range(n))
        rows.append({"topic": name, "read_queues": tc.read_queue_nums,
                     "write_queues": tc.write_queue_nums, "perm": tc.perm, "order": tc.order,
                     "messages": messages})
    return {"total": len(names), "offset": offset, "items": rows}


def topic_detail(broker, name: str) -> dict[str, Any]:
    tc = broker.topic_config_manager.get(name)
    if tc is None:
        raise BadRequest(f"no topic {name[:200]!r} on this broker")
    store = broker.store
    queues = [{"queue": q, "min": store.min_offset(name, q), "max": store.max_offset(name, q)}
              for q in range(min(tc.queue_nums, MAX_QUEUES_SHOWN))]
    groups = sorted(broker.offset_manager.groups_of_topic(name))[:MAX_PAGE]
    return {"topic": name, "queues": queues, "queues_total": tc.queue_nums, "groups": groups}


def groups_page(broker, query: dict[str, str]) -> dict[str, Any]:
    """Consumer groups with their committed offsets and lag, one row per (group, topic)."""
    offset, limit = page_args(query)
    store = broker.store
    table = broker.offset_manager.table
    online = broker.consumer_manager.groups
    rows = []
    total = 0
    for key in itertools.islice(table, MAX_SCAN_GROUPS):
        topic, _, group = key.rpartition("@")
        total += 1
        if total <= offset or len(rows) >= limit:
            continue
        offsets = table.get(key) or {}
        lag = sum(max(0, store.max_offset(topic, q) - o) for q, o in offsets.items())
        info = online.get(group)
        rows.append({"group": group, "topic": topic, "queues": len(offsets), "lag": lag,
                     "clients": len(info.channels) if info is not None else 0})
    return {"total": total, "offset": offset, "items": rows,
            "truncated": len(table) > MAX_SCAN_GROUPS}


def messages(broker, query: dict[str, str]) -> dict[str, Any]:
    """The message browser: by `id` (offset msgId, or UNIQ_KEY with `topic`), by `key` (with
    `topic`), or by `topic` + `queue` + `offset` (+ `count`)."""
    from core.common.codec import decode_record

    store = broker.store
    topic = query.get("topic", "")
    if query.get("id"):
        found = _by_id(store, query["id"].strip(), topic)
    elif query.get("key"):
        if not topic:
            raise BadRequest("a key search needs the topic")
        found = [decode_record(r) for r in store.query_by_key(topic, query["key"], MAX_MESSAGES)]
    elif topic:
        queue = int_arg(query, "queue", 0)
        start = int_arg(query, "offset", -1)
        count = min(max(1, int_arg(query, "count", 10)), MAX_MESSAGES)
        if start < 0:  # default: the last `count` messages
            start = max(store.min_offset(topic, queue), store.max_offset(topic, queue) - count)
        found = [m for m in (store.look_message(phys)
                             for phys, _size, _tag in store.units(topic, queue, start, count))
                 if m is not None]
    else:
        raise BadRequest("give a topic (with queue and offset, or a key) or a message id")
    return {"items": [_message_row(m) for m in found[:MAX_MESSAGES]]}


def _by_id(store, msg_id: str, topic: str) -> list:
    from core.common.codec import decode_record
    from core.common.msgid import decode_offset_msg_id

    try:
        _ip, _port, phys = decode_offset_msg_id(msg_id)
    except ValueError:
        phys = None
    if phys is not None:
        msg = store.look_message(phys)
        if msg is not None:
            return [msg]
    if topic:
        return [decode_record(r) for r in store.query_by_uniq_key(topic, msg_id)]
    return []


def _message_row(m) -> dict[str, Any]:
    props = dict(itertools.islice(m.properties.items(), 64))
    return {"topic": m.topic, "queue": m.queue_id, "offset": m.queue_offset,
            "msg_id": m.msg_id, "offset_msg_id": m.offset_msg_id, "keys": m.keys,
            "tags": m.tags, "store_time_ms": m.store_timestamp, "born_host": m.born_host,
            "properties": props, "body": preview(m.body, MAX_BODY_PREVIEW)}


# -- MQTT -------------------------------------------------------------------------------------

def mqtt_summary(gw) -> dict[str, Any]:
    s = gw.stats
    retained = getattr(gw, "retained", None)
    return {"connections": s.connections, "clients": s.clients,
            "sessions": len(gw.registry.sessions),
            "subscriptions": gw.registry.subscription_count,
            "retained": len(retained.messages) if retained is not None else 0,
            "msgs_in": s.msgs_in, "msgs_out": s.msgs_out, "dropped": s.dropped,
            "ports": dict(getattr(gw, "ports", {}) or {})}


def mqtt_clients_page(gw, query: dict[str, str]) -> dict[str, Any]:
    offset, limit = page_args(query)
    sessions = gw.registry.sessions
    needle = query.get("q", "")
    items: Iterable = sessions.values()
    if needle:  # bounded: a page of matches, scanning at most MAX_SCAN_GROUPS sessions
        items = (s for s in itertools.islice(sessions.values(), MAX_SCAN_GROUPS)
                 if needle in s.client_id)
    rows = []
    for sess in _page(items, offset, limit):
        conn = sess.conn
        rows.append({"client_id": sess.client_id, "connected": conn is not None,
                     "remote": getattr(conn, "remote", None) if conn is not None else None,
                     "username": getattr(conn, "username", None) if conn is not None else None,
                     "version": sess.version, "persistent": sess.persistent,
                     "expiry": sess.expiry, "subscriptions": sorted(sess.subs)[:32],
                     "subscription_count": len(sess.subs), "inflight": len(sess.inflight)})
    return {"total": len(sessions), "offset": offset, "items": rows}


def retained_page(gw, query: dict[str, str]) -> dict[str, Any]:
    offset, limit = page_args(query)
    retained = getattr(gw, "retained", None)
    table = retained.messages if retained is not None else {}
    rows = []
    for topic, msg in _page(table.items(), offset, limit):
        rows.append({"topic": topic, "qos": getattr(msg, "qos", 0),
                     "payload": preview(getattr(msg, "payload", b""), MAX_PAYLOAD_PREVIEW)})
    return {"total": len(table), "offset": offset, "items": rows}


# -- AMQP -------------------------------------------------------------------------------------

def amqp_summary(amqp, broker) -> dict[str, Any]:
    """Exchanges, queues (with bindings and a message count read from the store) of the
    embedded AMQP gateway; `amqp` is its AmqpBroker."""
    exchanges = [{"name": x.name, "type": x.type, "durable": x.durable,
                  "auto_delete": x.auto_delete, "internal": x.internal}
                 for x in itertools.islice(amqp.exchanges.values(), MAX_PAGE)]
    queues = []
    prefix = amqp.config.group_prefix
    for q in itertools.islice(amqp.queues.values(), MAX_PAGE):
        ready = None
        if broker is not None:
            end = broker.store.max_offset(q.lmq, 0)
            done = broker.offset_manager.query(prefix + q.lmq, q.lmq, 0)
            if done < 0:
                done = broker.store.min_offset(q.lmq, 0)
            ready = max(0, end - done)
        bindings = [{"exchange": r.exchange, "routing_key": r.pattern,
                     "kind": r.kind} for r in itertools.islice(q.routes, 64)]
        queues.append({"name": q.name, "lmq": q.lmq, "durable": q.durable,
                       "exclusive": q.exclusive, "auto_delete": q.auto_delete,
                       "consumers": q.consumers, "messages": ready, "bindings": bindings})
    return {"exchanges": exchanges, "exchanges_total": len(amqp.exchanges),
            "queues": queues, "queues_total": len(amqp.queues), "stats": dict(amqp.stats)}
