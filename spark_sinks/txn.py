"""Transactional plumbing of the sink: half messages sent by tasks, the commit record of a
micro-batch, and END_TRANSACTION from the driver (docs/spark.md, "Exactly once").

The commit record of (query, batch) is one message on the commit topic (default
``SPARK_LMQ_COMMITS``, queue 0 of its first broker by name) with the key
``<query id>:<batch id>``, found again through the broker's key index (QUERY_MESSAGE), so a
sink needs no right beyond PUB/SUB on its topics (INNER_* properties are reserved).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import trio

from core.client.errors import MQClientError
from core.client.model import MessageQueue
from core.client.producer import Producer
from core.client.pull_consumer import broker_addr_for
from core.common.message import Message
from core.common.msgid import decode_offset_msg_id
from core.common.properties import MessageConst
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import RequestCode

P_QUERY = "SPARK_QUERY"
P_BATCH = "SPARK_BATCH"
P_TASK = "SPARK_TASK"
#: Half messages a task keeps in flight.
HALF_WINDOW = 64
#: A commit record's body limit (the broker's message body limit is 4 MiB; zlib applies).
MAX_RECORD_BYTES = 4 * 1024 * 1024 - 4096


@dataclass(frozen=True, slots=True)
class Half:
    """Handle of one half message: enough to end its transaction and to find it later."""

    broker: str
    commitlog_offset: int
    queue_offset: int  # in the half topic (tranStateTableOffset)
    uniq: str
    topic: str


async def send_halves(producer: Producer, msgs: list[Message], tag: dict[str, str]) -> list[Half]:
    """Send `msgs` as half messages (invisible until committed), HALF_WINDOW at a time."""
    out: list[Half | None] = [None] * len(msgs)
    limiter = trio.CapacityLimiter(HALF_WINDOW)

    async def one(i: int, msg: Message) -> None:
        async with limiter:
            msg.properties.update(tag)
            msg.properties[MessageConst.TRANSACTION_PREPARED] = "true"
            msg.properties[MessageConst.PRODUCER_GROUP] = producer.group
            res = await producer.send(msg)
            _, _, phys = decode_offset_msg_id(res.offset_msg_id)
            out[i] = Half(res.message_queue.broker_name, phys, res.queue_offset, res.msg_id,
                          msg.topic)

    async with trio.open_nursery() as nursery:  # callers hand over bounded chunks
        for i, m in enumerate(msgs):
            nursery.start_soon(one, i, m)
    return [h for h in out if h is not None]


async def end_halves(instance, group: str, halves: list[Half], commit: bool) -> None:
    """END_TRANSACTION (answered, not one-way) for every half; raises on any failure."""
    decision = (MessageSysFlag.TRANSACTION_COMMIT_TYPE if commit
                else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)
    limiter = trio.CapacityLimiter(HALF_WINDOW)
    addrs = {}
    for key in {(h.topic, h.broker) for h in halves}:
        addrs[key] = await broker_addr_for(instance, MessageQueue(key[0], key[1], 0))

    async def one(h: Half) -> None:
        async with limiter:
            await instance.api.call(addrs[(h.topic, h.broker)], RequestCode.END_TRANSACTION, {
                "producerGroup": group,
                "tranStateTableOffset": str(h.queue_offset),
                "commitLogOffset": str(h.commitlog_offset),
                "commitOrRollback": str(decision),
                "fromTransactionCheck": "false",
                "msgId": h.uniq,
                "transactionId": h.uniq,
            })

    async with trio.open_nursery() as nursery:
        for h in halves:
            nursery.start_soon(one, h)


# -- commit records -------------------------------------------------------------------------


async def _record_broker(instance, commit_topic: str) -> tuple[str, str]:
    """(broker name, address) that holds the commit records: the first master by name."""
    masters = (await instance.api.get_cluster_info()).master_addrs()
    if not masters:
        raise MQClientError("no broker to record Spark commits on")
    name = sorted(masters)[0]
    return name, masters[name]


async def find_record(instance, commit_topic: str, query_id: str, batch_id: int) -> dict | None:
    """The commit record of (query, batch), or None: looked up in the broker's key index by
    its key ``<query id>:<batch id>`` (docs/spark.md, "Exactly once")."""
    _broker, addr = await _record_broker(instance, commit_topic)
    found = await instance.api.query_message(addr, commit_topic, record_key(query_id, batch_id))
    for m in found:
        if m.properties.get(P_QUERY) == query_id and m.properties.get(P_BATCH) == str(batch_id):
            # up to 4 MiB of JSON: parsed off the client's event loop
            return await trio.to_thread.run_sync(json.loads, m.body)
    return None


def record_key(query_id: str, batch_id: int) -> str:
    return f"{query_id}:{batch_id}"


async def write_record(instance, producer: Producer, commit_topic: str, query_id: str,
                       batch_id: int, halves: list[Half]) -> None:
    """Store the commit record of (query, batch), listing its half messages."""
    broker, addr = await _record_broker(instance, commit_topic)
    route = await instance.update_route(commit_topic)
    if route is None or not any(q.broker_name == broker for q in route.queue_datas):
        await instance.api.create_topic(addr, commit_topic, 1, 1)
        await instance.update_route(commit_topic)
    record = {"query": query_id, "batch": batch_id,
              "halves": [[h.broker, h.commitlog_offset, h.queue_offset, h.uniq, h.topic]
                         for h in halves]}
    body = await trio.to_thread.run_sync(
        lambda: json.dumps(record, separators=(",", ":")).encode())
    if len(body) > MAX_RECORD_BYTES:
        raise MQClientError(f"commit record of batch {batch_id} is {len(body)} bytes (limit "
                            f"{MAX_RECORD_BYTES}): make micro-batches smaller")
    msg = Message(commit_topic, body)
    msg.keys = [record_key(query_id, batch_id)]
    msg.properties.update({P_QUERY: query_id, P_BATCH: str(batch_id)})
    await producer.send_to_queue(msg, MessageQueue(commit_topic, broker, 0))


def halves_of(record: dict) -> list[Half]:
    return [Half(b, int(c), int(q), u, t) for b, c, q, u, t in record.get("halves", [])]


async def uncommitted(instance, halves: list[Half]) -> list[Half]:
    """The halves whose committed copy is not in their topic yet (looked up by UNIQ_KEY):
    what a replay must still commit after a crash between the record and the commits."""
    out = []
    for h in halves:
        addr = await broker_addr_for(instance, MessageQueue(h.topic, h.broker, 0))
        found = await instance.api.query_message(addr, h.topic, h.uniq, 32, 0, None, unique=True)
        if not any(m.msg_id == h.uniq for m in found):
            out.append(h)
    return out
