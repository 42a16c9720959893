"""Transactional plumbing of the sink: prepared batches sent by tasks, the commit record of a
micro-batch, and END_TRANSACTION from the driver (docs/spark.md, "Exactly once"; the broker
side is core/broker/transaction_batch.py).

A task encodes its rows into chunks of at most `CHUNK_ROWS` rows (one topic) and sends each
chunk as one prepared batch, which the broker keeps as ONE half message; one
END_TRANSACTION commits the whole chunk (one all-or-nothing append) or rolls it back. The
handle of a chunk (`Chunk`) names that half and recognises its rows: row i's UNIQ_KEY is
the chunk's 24-hex-digit prefix followed by i in 8 hex digits, the half's is the prefix
followed by FFFFFFFF.

The commit record of (query, batch) is one message on the commit topic (default
``SPARK_LMQ_COMMITS``, queue 0 of its first broker by name) with the key
``<query id>:<batch id>``, found again through the broker's key index (QUERY_MESSAGE), so a
sink needs no right beyond PUB/SUB on its topics (INNER_* properties are reserved).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import trio

from core.client.errors import MQBrokerError, MQClientError
from core.client.model import MessageQueue
from core.client.pull_consumer import broker_addr_for
from core.common.codec import BATCH_HEAD, INT16
from core.common.message import Message
from core.common.msgid import decode_offset_msg_id
from core.common.names import NOT_ALLOWED_SEND_TOPICS, validate_topic
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import RequestCode, ResponseCode

P_QUERY = "SPARK_QUERY"
P_BATCH = "SPARK_BATCH"
P_TASK = "SPARK_TASK"
#: Rows per chunk: one prepared batch send and one END_TRANSACTION each.
CHUNK_ROWS = 1024
#: Encoded bytes per chunk at most (the broker's message size limit is 4 MiB).
CHUNK_BYTES = 1 << 20
#: Chunks (sends or END_TRANSACTIONs) in flight per task or driver.
WINDOW = 8
#: A commit record's body limit (the broker's message body limit is 4 MiB; zlib applies).
MAX_RECORD_BYTES = 4 * 1024 * 1024 - 4096

_SEP_PAIR = "\x02"
_SEP_KV = "\x01"
_UNIQ = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX + _SEP_KV
#: How a row's UNIQ_KEY starts in its encoded properties (sink.py re-keys a chunk with it).
UNIQ_PROP = _UNIQ
_KEYS = _SEP_PAIR + MessageConst.KEYS + _SEP_KV
_TAGS = _SEP_PAIR + MessageConst.TAGS + _SEP_KV
_HEAD = BATCH_HEAD.pack
_I16 = INT16.pack


@dataclass(frozen=True, slots=True)
class Chunk:
    """Handle of one chunk: its half message (offsets) and its rows (count, UNIQ_KEYs)."""

    broker: str
    topic: str
    queue_id: int
    half_offset: int        # tranStateTableOffset of the half
    commitlog_offset: int   # commit-log offset of the half
    count: int
    uniq_prefix: str        # row i's UNIQ_KEY = uniq_prefix + f"{i:08X}"

    def uniq(self, i: int) -> str:
        """UNIQ_KEY of row i (as its committed message carries it)."""
        return f"{self.uniq_prefix}{i:08X}"

    @property
    def half_uniq(self) -> str:
        """UNIQ_KEY of the chunk's half message (no row has it: rows < 2**32 - 1)."""
        return f"{self.uniq_prefix}FFFFFFFF"

    def holds(self, uniq: str | None) -> bool:
        return uniq == self.half_uniq


class ChunkBuilder:
    """Encodes rows of one topic into batch send bodies (docs/protocol.md §7.7)."""

    __slots__ = ("topic", "parts", "size", "count", "prefix")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.parts: list[bytes] = []
        self.size = 0
        self.count = 0
        self.prefix = uuid.uuid4().hex[:24].upper()

    def add(self, value: bytes, key: str | None, tags: str | None, props,
            extra: dict[str, str] | None = None) -> None:
        if not value:
            raise ValueError("the lmq sink cannot write an empty 'value'")
        p = f"{_UNIQ}{self.prefix}{self.count:08X}"
        if key:
            p += _KEYS + key
        if tags:
            p += _TAGS + tags
        if props:
            user = encode_properties({str(k): str(v) for k, v in props
                                      if k is not None and v is not None})
            if user:
                p += _SEP_PAIR + user
        if extra:
            p += _SEP_PAIR + encode_properties(extra)
        pb = p.encode()
        blen = len(value)
        total = 22 + blen + len(pb)
        self.parts += (_HEAD(total, 0, 0, 0, blen), value, _I16(len(pb)), pb)
        self.size += total
        self.count += 1

    def full(self) -> bool:
        return self.count >= CHUNK_ROWS or self.size >= CHUNK_BYTES

    def take(self) -> tuple[str, bytes, int, str]:
        """(topic, body, rows, uniq prefix); the builder starts a new chunk."""
        out = (self.topic, b"".join(self.parts), self.count, self.prefix)
        self.parts, self.size, self.count = [], 0, 0
        self.prefix = uuid.uuid4().hex[:24].upper()
        return out


async def send_chunk(producer, topic: str, body: bytes, count: int, prefix: str,
                     tag: dict[str, str], timeout: float) -> Chunk:
    """One prepared batch: `count` encoded rows of `topic` stored as half messages, on the
    topic's next writable queue (round robin)."""
    reason = validate_topic(topic)
    if reason or topic in NOT_ALLOWED_SEND_TOPICS:
        raise MQClientError(reason or f"sending to topic {topic!r} is forbidden")
    instance = producer.client
    info = await producer.find_publish_info(topic)
    mq = info.queues[info.next_index() % len(info.queues)]
    addr = await broker_addr_for(instance, mq)
    props = dict(tag)
    props[MessageConst.WAIT_STORE_MSG_OK] = "true"
    props[MessageConst.PRODUCER_GROUP] = producer.group
    props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = f"{prefix}FFFFFFFF"
    ext = {"a": producer.group, "b": mq.topic, "c": producer.create_topic_key,
           "d": str(producer.default_topic_queue_nums), "e": str(mq.queue_id),
           "f": str(MessageSysFlag.TRANSACTION_PREPARED_TYPE), "g": str(int(time.time() * 1000)),
           "h": "0", "i": encode_properties(props), "j": "0", "k": "false", "m": "true"}
    res = await instance.api.send_message(addr, mq, ext, body, batch=True,
                                          uniq_id=f"{prefix}FFFFFFFF", timeout=timeout)
    _, _, phys = decode_offset_msg_id(res.offset_msg_id)
    return Chunk(mq.broker_name, mq.topic, mq.queue_id, res.queue_offset, phys, count, prefix)


async def end_chunks(instance, group: str, chunks: list[Chunk], commit: bool) -> None:
    """One END_TRANSACTION (answered, not one-way) per chunk, WINDOW in flight; raises on
    any failure."""
    decision = (MessageSysFlag.TRANSACTION_COMMIT_TYPE if commit
                else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)
    limiter = trio.CapacityLimiter(WINDOW)
    addrs = {}
    for key in {(c.topic, c.broker) for c in chunks}:
        addrs[key] = await broker_addr_for(instance, MessageQueue(key[0], key[1], 0))

    async def one(c: Chunk) -> None:
        async with limiter:
            ext = {"producerGroup": group, "tranStateTableOffset": str(c.half_offset),
                   "commitLogOffset": str(c.commitlog_offset),
                   "commitOrRollback": str(decision), "fromTransactionCheck": "false",
                   "msgId": c.half_uniq, "transactionId": c.half_uniq}
            await instance.api.call(addrs[(c.topic, c.broker)], RequestCode.END_TRANSACTION, ext)

    async with trio.open_nursery() as nursery:
        for c in chunks:
            nursery.start_soon(one, c)


# -- commit records -------------------------------------------------------------------------


async def _record_broker(instance, commit_topic: str) -> tuple[str, str]:
    """(broker name, address) that holds the commit records: the first broker name, at
    its master. While that name has no master (a failover under way) this raises (a
    retryable "no broker" error) rather than look on another name: a record not found
    there would make a replayed batch look new."""
    info = await instance.api.get_cluster_info()
    if not info.brokers:
        raise MQClientError("no broker to record Spark commits on")
    name = sorted(info.brokers)[0]
    addr = info.brokers[name].master_addr()
    if not addr:
        raise MQClientError(f"no broker master for {name} (to record Spark commits on) yet")
    return name, addr


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


async def write_record(instance, producer, commit_topic: str, query_id: str,
                       batch_id: int, chunks: list[Chunk]) -> None:
    """Store the commit record of (query, batch), listing its chunks."""
    broker, addr = await _record_broker(instance, commit_topic)
    route = await instance.update_route(commit_topic)
    if route is None or not any(q.broker_name == broker for q in route.queue_datas):
        await instance.api.create_topic(addr, commit_topic, 1, 1)
        await instance.update_route(commit_topic)
    record = {"query": query_id, "batch": batch_id,
              "chunks": [[c.broker, c.topic, c.queue_id, c.half_offset, c.commitlog_offset,
                          c.count, c.uniq_prefix] for c in chunks]}
    body = await trio.to_thread.run_sync(
        lambda: json.dumps(record, separators=(",", ":")).encode())
    if len(body) > MAX_RECORD_BYTES:
        raise MQClientError(f"commit record of batch {batch_id} is {len(body)} bytes (limit "
                            f"{MAX_RECORD_BYTES}): make micro-batches smaller")
    msg = Message(commit_topic, body)
    msg.keys = [record_key(query_id, batch_id)]
    msg.properties.update({P_QUERY: query_id, P_BATCH: str(batch_id)})
    mq = MessageQueue(commit_topic, broker, 0)
    try:
        await producer.send_to_queue(msg, mq)
    except MQBrokerError as exc:
        if exc.code != ResponseCode.TOPIC_NOT_EXIST:
            raise
        # A new master (failover) that had not synced the topic's config yet: create it
        # there, once, and store the record.
        await instance.api.create_topic(addr, commit_topic, 1, 1)
        await producer.send_to_queue(msg, mq)


def chunks_of(record: dict) -> list[Chunk]:
    return [Chunk(b, t, int(q), int(h), int(c), int(n), p)
            for b, t, q, h, c, n, p in record.get("chunks", [])]


async def uncommitted(instance, chunks: list[Chunk]) -> list[Chunk]:
    """The chunks whose committed copy is not in their topic yet, judged by their first row
    (a chunk is committed by one all-or-nothing append; looked up by UNIQ_KEY): what a replay
    must still commit after a crash between the record and the commits."""
    out = []
    for c in chunks:
        addr = await broker_addr_for(instance, MessageQueue(c.topic, c.broker, 0))
        first = c.uniq(0)
        found = await instance.api.query_message(addr, c.topic, first, 32, 0, None, unique=True)
        if not any(m.msg_id == first for m in found):
            out.append(c)
    return out
