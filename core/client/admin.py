"""`AdminClient`: cluster, topic, consumer-group and message administration (like mqadmin).

Every method returns plain data (dicts, lists, `MessageExt`), so `lmq admin` can print it
as a table or as JSON. Topic commands address every master of a cluster (all clusters by
default); lookups go to the brokers that hold the topic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import trio

from core.client.errors import MQBrokerError, MQClientError, NoRouteError
from core.client.instance import ClientInstance
from core.client.model import (
    ClusterInfo,
    MessageQueue,
    PullStatus,
    SubscriptionData,
    TopicRouteData,
)
from core.client.pull_consumer import pull_kernel
from core.common.message import Message, MessageExt
from core.common.msgid import decode_offset_msg_id
from core.common.names import (
    LMQ_QUEUE_ID,
    TOOLS_CONSUMER_GROUP,
    is_lmq,
    retry_topic,
    validate_lmq,
    validate_topic,
)
from core.remoting.codes import RequestCode, ResponseCode


def decode_mq_map(text: str) -> list[tuple[MessageQueue, Any]]:
    """Parse fastjson's Map<MessageQueue, V> text, whose keys are JSON objects
    (``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``), into (queue, value) pairs."""
    decoder = json.JSONDecoder()
    out: list[tuple[MessageQueue, Any]] = []
    pos = text.index("{") + 1
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "}":
            break
        key, pos = decoder.raw_decode(text, pos)
        while text[pos] in " \t\r\n:":
            pos += 1
        value, pos = decoder.raw_decode(text, pos)
        if isinstance(key, str):
            key = json.loads(key)
        out.append((MessageQueue.from_json(key), value))
    return out


def _table_body(body: bytes, field: str) -> list[tuple[MessageQueue, Any]]:
    """Extract the object-keyed map under `field` of a broker's stats body."""
    text = body.decode("utf-8")
    key = f'"{field}"'
    start = text.index(key) + len(key)
    start = text.index("{", start)
    depth = 0
    in_str = False
    esc = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return decode_mq_map(text[start:i + 1])
    raise ValueError(f"unterminated {field} in stats body")


def message_to_dict(msg: MessageExt, body_limit: int = 1024) -> dict[str, Any]:
    """A message as JSON-friendly data (body as text when UTF-8, else hex)."""
    try:
        body: str = msg.body[:body_limit].decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        body = msg.body[:body_limit].hex()
        encoding = "hex"
    return {
        "msgId": msg.msg_id,
        "offsetMsgId": msg.offset_msg_id,
        "topic": msg.topic,
        "tags": msg.tags,
        "keys": msg.keys,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "commitLogOffset": msg.commitlog_offset,
        "reconsumeTimes": msg.reconsume_times,
        "bornTimestamp": msg.born_timestamp,
        "bornHost": msg.born_host,
        "storeTimestamp": msg.store_timestamp,
        "storeHost": msg.store_host,
        "sysFlag": msg.sys_flag,
        "properties": dict(msg.properties),
        "bodyLength": len(msg.body),
        "body": body,
        "bodyEncoding": encoding,
    }


class AdminClient:
    """Administration over a running `ClientInstance`."""

    def __init__(self, client: ClientInstance) -> None:
        self.client = client
        self.api = client.api

    # -- cluster --------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        return await self.api.get_cluster_info()

    async def cluster_list(self) -> list[dict[str, Any]]:
        """One row per broker address: cluster, broker name, id, address and, when the
        broker answers, a few runtime figures."""
        info = await self.cluster_info()
        rows = []
        for cluster, names in sorted(info.clusters.items()):
            for name in names:
                bd = info.brokers.get(name)
                if bd is None:
                    continue
                for bid, addr in sorted(bd.broker_addrs.items()):
                    row: dict[str, Any] = {"cluster": cluster, "brokerName": name,
                                           "brokerId": bid, "addr": addr}
                    try:
                        resp = await self.api.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                        table = json.loads(resp.body_bytes() or b"{}").get("table", {})
                        row["version"] = table.get("brokerVersionDesc", "")
                        row["uptime"] = table.get("runtime", "")
                        row["status"] = "up"
                    except Exception as exc:
                        row["status"] = f"down ({type(exc).__name__})"
                    rows.append(row)
        return rows

    async def _masters(self, cluster: str | None = None) -> dict[str, str]:
        info = await self.cluster_info()
        if cluster and cluster not in info.clusters:
            raise MQClientError(f"cluster {cluster!r} is unknown to the name servers")
        masters = info.master_addrs(cluster)
        if not masters:
            raise MQClientError("no broker is registered with the name servers")
        return masters

    # -- topics ---------------------------------------------------------------------

    async def topic_list(self) -> list[str]:
        return await self.api.get_all_topic_list()

    async def topic_route(self, topic: str) -> TopicRouteData:
        route = await self.client.update_route(topic)  # also learns the broker addresses
        if route is None:
            raise NoRouteError(topic)
        return route

    async def topic_create(self, topic: str, *, read_queue_nums: int = 8, write_queue_nums: int = 8,
                           perm: int = 6, order: bool = False, cluster: str | None = None,
                           broker_addr: str | None = None) -> list[str]:
        """Create or update `topic` on one broker or on every master of `cluster` (all
        clusters when None). Returns the addresses updated."""
        reason = validate_topic(topic)
        if reason:
            raise MQClientError(reason)
        if read_queue_nums < 1 or write_queue_nums < 1:
            raise MQClientError("queue numbers must be at least 1")
        if perm not in (2, 4, 6, 7):
            raise MQClientError(f"perm must be 2 (write), 4 (read), 6 or 7, not {perm}")
        addrs = [broker_addr] if broker_addr else sorted((await self._masters(cluster)).values())
        for addr in addrs:
            await self.api.create_topic(addr, topic, read_queue_nums, write_queue_nums, perm, order)
        return addrs

    async def topic_delete(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """Delete `topic` on the masters of `cluster` and from every name server."""
        if is_lmq(topic):
            reason = validate_lmq(topic)
        else:
            reason = validate_topic(topic)
        if reason:
            raise MQClientError(reason)
        if not is_lmq(topic):
            route = await self.api.get_route(topic)
            if route is None:
                raise NoRouteError(topic)
        addrs = sorted((await self._masters(cluster)).values())
        for addr in addrs:
            await self.api.delete_topic_in_broker(addr, topic)
        if not is_lmq(topic):
            for ns in self.client.config.namesrv_addrs:
                await self.api.delete_topic_in_namesrv(ns, topic)
        return addrs

    async def topic_status(self, topic: str) -> list[dict[str, Any]]:
        """Per queue: min offset, max offset, last update time."""
        route = await self.topic_route(topic)
        rows = []
        for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
            addr = bd.master_addr()
            if not addr:
                continue
            resp = await self.api.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            for mq, v in sorted(_table_body(resp.body_bytes(), "offsetTable")):
                rows.append({"brokerName": mq.broker_name, "queueId": mq.queue_id,
                             "minOffset": int(v.get("minOffset", 0)),
                             "maxOffset": int(v.get("maxOffset", 0)),
                             "lastUpdateTimestamp": int(v.get("lastUpdateTimestamp", 0))})
        return rows

    # -- consumer groups --------------------------------------------------------------

    async def consumer_progress(self, group: str, topic: str | None = None) -> list[dict[str, Any]]:
        """Per queue: broker offset, consumer offset and lag (GET_CONSUME_STATS on every
        master; the group's %RETRY% topic included)."""
        rows = []
        for _name, addr in sorted((await self._masters()).items()):
            ext = {"consumerGroup": group}
            if topic:
                ext["topic"] = topic
            try:
                resp = await self.api.call(addr, RequestCode.GET_CONSUME_STATS, ext)
            except MQBrokerError as exc:
                if exc.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST):
                    continue
                raise
            for mq, v in _table_body(resp.body_bytes(), "offsetTable"):
                broker_off = int(v.get("brokerOffset", 0))
                consumer_off = int(v.get("consumerOffset", 0))
                rows.append({"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id,
                             "brokerOffset": broker_off, "consumerOffset": consumer_off,
                             "lag": max(0, broker_off - consumer_off),
                             "lastTimestamp": int(v.get("lastTimestamp", 0))})
        if topic:
            rt = retry_topic(group)
            if topic != rt:
                rows = [r for r in rows if r["topic"] == topic]
        rows.sort(key=lambda r: (r["topic"], r["brokerName"], r["queueId"]))
        return rows

    async def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int) -> list[dict[str, Any]]:
        """Set the group's offset of every queue of `topic` to the first message stored at
        or after `timestamp_ms` (the max offset if none). Each broker commits the new
        offsets and pushes them to the group's live members (INVOKE_BROKER_TO_RESET_OFFSET),
        so running consumers switch at once."""
        route = await self.topic_route(topic)
        rows = []
        brokers = sorted({mq.broker_name for mq in route.subscribe_queues(topic)})
        for broker_name in brokers:
            addr = self.client.find_broker_addr(broker_name) or _master(route, broker_name)
            if addr is None:
                continue
            old = {}
            for mq in route.subscribe_queues(topic):
                if mq.broker_name == broker_name:
                    old[mq.queue_id] = await self.api.query_consumer_offset(
                        addr, group, topic, mq.queue_id
                    )
            resp = await self.api.call(
                addr,
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                {"topic": topic, "group": group, "timestamp": str(timestamp_ms), "isForce": "true"},
            )
            for entry in json.loads(resp.body_bytes() or b"{}").get("offsetTable", []):
                qid = int(entry["queueId"])
                rows.append({"topic": topic, "brokerName": broker_name, "queueId": qid,
                             "oldOffset": old.get(qid, -1), "newOffset": int(entry["offset"])})
        return rows

    # -- messages ---------------------------------------------------------------------

    async def message_by_id(self, msg_id: str, topic: str | None = None) -> list[MessageExt]:
        """By offset msgId (the broker's id: the message's address is in it) or, with a
        `topic`, by the client id (UNIQ_KEY)."""
        try:
            ip, port, offset = decode_offset_msg_id(msg_id)
        except ValueError:
            ip = None
        if ip is not None:
            try:
                return [await self.api.view_message(f"{ip}:{port}", offset)]
            except Exception:
                if topic is None:
                    raise
        if topic is None:
            raise MQClientError(f"{msg_id!r} is not an offset message id; give the topic to "
                                "look it up as a client (UNIQ_KEY) id")
        found = await self._query(topic, msg_id, 32, 0, None, unique=True)
        return [m for m in found if m.msg_id == msg_id] or found

    async def message_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                             end_ms: int | None = None) -> list[MessageExt]:
        return await self._query(topic, key, max_num, begin_ms, end_ms, unique=False)

    async def _query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int | None,
                     unique: bool) -> list[MessageExt]:
        route = await self.topic_route(topic)
        out: list[MessageExt] = []
        for bd in route.broker_datas:
            addr = bd.master_addr()
            if addr:
                out.extend(await self.api.query_message(addr, topic, key, max_num, begin_ms, end_ms, unique))
        out.sort(key=lambda m: (m.store_timestamp, m.commitlog_offset))
        return out[:max_num] if max_num > 0 else out

    async def send_message(self, topic: str, body: bytes, *, tags: str | None = None,
                           keys: str | None = None, properties: dict[str, str] | None = None,
                           group: str = "TOOLS_PRODUCER") -> Any:
        """Send one message (`lmq admin send`); returns the SendResult."""
        from core.client.producer import Producer

        msg = Message(topic, body, properties=dict(properties or {}))
        if tags:
            msg.tags = tags
        if keys:
            msg.keys = keys.split()
        async with Producer(self.client, group) as producer:
            return await producer.send(msg)

    async def tail(self, topic: str, on_message: Callable[[MessageExt], Any], *,
                   from_beginning: bool = False, expression: str = "*",
                   cluster: str | None = None, max_messages: int | None = None,
                   group: str = TOOLS_CONSUMER_GROUP) -> int:
        """Call `on_message(msg)` for new messages of a topic (every queue) or an LMQ
        (queue 0 on every master) as they arrive, without storing offsets. Runs until
        cancelled or `max_messages` were seen; returns the number seen."""
        if is_lmq(topic):
            reason = validate_lmq(topic)
            if reason:
                raise MQClientError(reason)
            masters = await self._masters(cluster)
            info = await self.cluster_info()
            self.client.pin_brokers({n: info.brokers[n].broker_addrs for n in masters})
            mqs = [MessageQueue(topic, name, LMQ_QUEUE_ID) for name in sorted(masters)]
        else:
            mqs = (await self.topic_route(topic)).subscribe_queues(topic)
        sub = SubscriptionData.build(topic, expression)
        seen = 0
        starts = {}
        for mq in mqs:
            addr = self.client.find_broker_addr(mq.broker_name)
            if addr is None:
                raise MQClientError(f"The broker[{mq.broker_name}] not exist")
            starts[mq] = 0 if from_beginning else await self.api.get_max_offset(addr, mq.topic, mq.queue_id)

        async def follow(mq: MessageQueue, scope: trio.CancelScope) -> None:
            nonlocal seen
            offset = starts[mq]
            while True:
                try:
                    result = await pull_kernel(self.client, group, mq, sub, offset, 32, suspend_ms=5000)
                except Exception:
                    await trio.sleep(1.0)
                    continue
                offset = result.next_begin_offset
                if result.status is PullStatus.FOUND:
                    for m in result.messages:
                        if max_messages is not None and seen >= max_messages:
                            scope.cancel()
                            return
                        seen += 1
                        on_message(m)
                    if max_messages is not None and seen >= max_messages:
                        scope.cancel()
                        return

        async with trio.open_nursery() as nursery:
            for mq in mqs:
                nursery.start_soon(follow, mq, nursery.cancel_scope)
        return seen


def _master(route: TopicRouteData, broker_name: str) -> str | None:
    for bd in route.broker_datas:
        if bd.broker_name == broker_name:
            return bd.master_addr()
    return None


def now_ms() -> int:
    return int(time.time() * 1000)
