"""`df.write.format("lmq")` and `df.writeStream.format("lmq")` (docs/spark.md).

Tasks (Arrow writers) encode their rows into chunks and send each as one prepared batch,
which the broker keeps as one half message, invisible to consumers (txn.py); they hand
the chunks' handles to the driver. Batch writes: the driver's commit commits every chunk,
abort rolls them back. Streaming (exactly once): the driver's ``commit(messages,
batchId)`` first looks for the commit record of (query id, batch id); when there is none
it stores the record (listing the chunks) and then commits the chunks; when there is one,
the batch is a replay: its new chunks are rolled back, and the recorded chunks not in
their topic yet (a crash between the record and the commits) are committed. Rows with an
`mqttTopic` are MQTT traffic (mqtt_out.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegralType,
    MapType,
    StringType,
    StructType,
)

from core.client.transaction import LocalTransactionState
from spark_sinks.conn import client_for, request_pool
from spark_sinks.mqtt_out import DEFAULT_STORE_TOPIC, mqtt_properties, routes_for
from spark_sinks.options import SINK_OPTIONS, LmqOptionError, check_known, retry_timeout_s
from spark_sinks.retry import call_retrying, retrying
from spark_sinks.txn import (
    P_BATCH,
    P_QUERY,
    P_TASK,
    UNIQ_PROP,
    WINDOW,
    Chunk,
    ChunkBuilder,
    chunks_of,
    end_chunks,
    find_record,
    send_chunk,
    uncommitted,
    write_record,
)

log = logging.getLogger(__name__)

DEFAULT_GROUP = "SPARK_LMQ_SINK"
DEFAULT_COMMIT_TOPIC = "SPARK_LMQ_COMMITS"

_COLUMNS = {"value", "key", "topic", "tags", "properties", "mqttTopic", "qos", "retain"}


@dataclass(slots=True)
class SinkOptions:
    namesrv: str
    topic: str | None
    group: str = DEFAULT_GROUP
    commit_topic: str = DEFAULT_COMMIT_TOPIC
    request_timeout: float = 10.0
    query_id: str | None = None
    checkpoint: str | None = None
    mqtt_store_topic: str = DEFAULT_STORE_TOPIC
    #: lmq.retryTimeoutMs in seconds: how long a lost broker is retried (retry.py)
    retry_timeout: float = 30.0


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    low = {k.lower(): v for k, v in options.items()}
    opts = check_known(options, SINK_OPTIONS, "sink")
    namesrv = opts.get("lmq.namesrv", "").strip()
    if not namesrv:
        raise LmqOptionError("option 'lmq.namesrv' is required (name servers, ';'-separated)")
    try:
        timeout = float(opts.get("lmq.requesttimeout", "10"))
    except ValueError:
        raise LmqOptionError("option 'lmq.requestTimeout' must be a number of seconds") from None
    return SinkOptions(namesrv=namesrv, topic=opts.get("topic") or None,
                       group=opts.get("lmq.producergroup", DEFAULT_GROUP),
                       commit_topic=opts.get("lmq.committopic", DEFAULT_COMMIT_TOPIC),
                       request_timeout=timeout, query_id=opts.get("lmq.queryid"),
                       checkpoint=low.get("checkpointlocation"),
                       mqtt_store_topic=opts.get("lmq.mqttstoretopic") or DEFAULT_STORE_TOPIC,
                       retry_timeout=retry_timeout_s(opts))


def check_columns(schema: StructType, opts: SinkOptions) -> dict[str, int]:
    """Column name -> index; refuses a missing `value`, unknown columns and wrong types."""
    idx = {}
    for i, f in enumerate(schema.fields):
        if f.name not in _COLUMNS:
            raise LmqOptionError(f"column {f.name!r} is not written by the lmq sink; "
                                 f"its columns: {', '.join(sorted(_COLUMNS))}")
        if f.name == "value" and not isinstance(f.dataType, (BinaryType, StringType)):
            raise LmqOptionError("column 'value' must be binary or string")
        if f.name in ("key", "topic", "tags", "mqttTopic") \
                and not isinstance(f.dataType, StringType):
            raise LmqOptionError(f"column {f.name!r} must be a string")
        if f.name == "qos" and not isinstance(f.dataType, IntegralType):
            raise LmqOptionError("column 'qos' must be an integer (0, 1 or 2)")
        if f.name == "retain" and not isinstance(f.dataType, BooleanType):
            raise LmqOptionError("column 'retain' must be a boolean")
        if f.name == "properties" and not isinstance(f.dataType, MapType):
            raise LmqOptionError("column 'properties' must be a map<string,string>")
        idx[f.name] = i
    if "value" not in idx:
        raise LmqOptionError("the lmq sink needs a 'value' column")
    if ("qos" in idx or "retain" in idx) and "mqttTopic" not in idx:
        raise LmqOptionError("columns 'qos' and 'retain' need an 'mqttTopic' column")
    if "topic" not in idx and not opts.topic and "mqttTopic" not in idx:
        raise LmqOptionError("give the option 'topic' or a 'topic' column")
    return idx


@dataclass
class LmqCommitMessage(WriterCommitMessage):
    task: str
    chunks: list[Chunk] = field(default_factory=list)


# -- executor side -------------------------------------------------------------------------

_producers: dict[tuple[str, str], object] = {}
_plock = threading.Lock()


def _producer(opts: SinkOptions):
    """The process's transaction producer of the sink group (started once, reused)."""
    key = (opts.namesrv, opts.group)
    with _plock:
        p = _producers.get(key)
        if p is None:
            client = client_for(opts.namesrv, opts.request_timeout)

            async def check(msg):  # the broker's back-check of an unresolved half
                return await _check_half(client.instance, opts, msg)

            p = client.transaction_producer(
                opts.group, execute_local=lambda _m, _a: LocalTransactionState.UNKNOW,
                check=check, retry_times=0)
            p.start()
            _producers[key] = p
        return p


async def _check_half(instance, opts: SinkOptions, msg) -> LocalTransactionState:
    query, batch = msg.properties.get(P_QUERY), msg.properties.get(P_BATCH)
    if not query or batch is None:
        return LocalTransactionState.UNKNOW
    record = await find_record(instance, opts.commit_topic, query, int(batch))
    if record is None:
        return LocalTransactionState.UNKNOW
    uniq = msg.uniq_key
    if any(c.holds(uniq) for c in chunks_of(record)):
        return LocalTransactionState.COMMIT_MESSAGE
    return LocalTransactionState.ROLLBACK_MESSAGE


def _column(rb, idx: dict[str, int], name: str) -> list:
    if name not in idx:
        return [None] * rb.num_rows
    return rb.column(idx[name]).to_pylist()


def _rekey(body: bytes, old: str, new: str) -> bytes:
    """`body` with its rows' UNIQ_KEY prefix `old` replaced by `new` (same length: the
    encoded batch stays valid). Only the property (key, separator, prefix) is matched."""
    return body.replace(f"{UNIQ_PROP}{old}".encode(), f"{UNIQ_PROP}{new}".encode())


def send_chunk_retrying(client, opts: SinkOptions, producer, topic: str, body: bytes,
                        count: int, prefix: str, tag: dict[str, str]) -> Chunk:
    """Send one chunk; on a lost or moved broker, again (retry.py). A failed attempt may
    have stored its half all the same (the answer was lost): each new attempt gets new
    UNIQ_KEYs, so such a half is not the chunk the driver commits, and the broker's
    check of it rolls it back (it is in no commit record)."""
    state = {"body": body, "prefix": prefix}

    def attempt(n: int) -> Chunk:
        if n:
            new = uuid.uuid4().hex[:24].upper()
            state["body"] = _rekey(state["body"], state["prefix"], new)
            state["prefix"] = new
        return client.call(send_chunk, producer, topic, state["body"], count,
                           state["prefix"], tag, opts.request_timeout)

    return call_retrying(client, opts.retry_timeout, f"sending a chunk to {topic}", attempt)


def write_chunks(opts: SinkOptions, idx: dict[str, int], batches: Iterator, query: str,
                 batch: int) -> LmqCommitMessage:
    """Send the rows of Arrow record batches as chunks of half messages (txn.py)."""
    producer = _producer(opts).target
    client = client_for(opts.namesrv, opts.request_timeout)
    pool = request_pool()  # a task encodes the next chunk while WINDOW are on their way
    task = uuid.uuid4().hex
    tag = {P_QUERY: query, P_BATCH: str(batch), P_TASK: task}
    out = LmqCommitMessage(task)
    builders: dict[str, ChunkBuilder] = {}
    inflight: deque = deque()
    routes = None

    def flush(b: ChunkBuilder) -> None:
        topic, body, count, prefix = b.take()
        inflight.append(pool.submit(send_chunk_retrying, client, opts, producer, topic, body,
                                    count, prefix, tag))
        while len(inflight) >= WINDOW:
            out.chunks.append(inflight.popleft().result())

    try:
        for rb in batches:
            values = _column(rb, idx, "value")
            topics = _column(rb, idx, "topic")
            keys = _column(rb, idx, "key")
            tags = _column(rb, idx, "tags")
            props = _column(rb, idx, "properties")
            mqtt = _column(rb, idx, "mqttTopic")
            qos, retain = _column(rb, idx, "qos"), _column(rb, idx, "retain")
            for i, v in enumerate(values):
                if v is None:
                    raise ValueError("the lmq sink cannot write a null 'value'")
                if type(v) is str:
                    v = v.encode()
                extra = None
                if mqtt[i] is not None:  # MQTT traffic (mqtt_out.py)
                    if routes is None:
                        routes = routes_for(opts.namesrv, opts.request_timeout)
                    extra = mqtt_properties(mqtt[i], qos[i], retain[i],
                                            routes.table.mqtt_lmqs(mqtt[i]))
                    topic = opts.mqtt_store_topic
                else:
                    topic = topics[i] or opts.topic
                b = builders.get(topic)
                if b is None:
                    if not topic:
                        raise ValueError("a row has no topic (null 'topic' column and no "
                                         "'topic' option)")
                    b = builders[topic] = ChunkBuilder(topic)
                b.add(v, keys[i], tags[i], props[i], extra)
                if b.full():
                    flush(b)
        for b in builders.values():
            if b.count:
                flush(b)
    finally:
        while inflight:  # wait for every send; the first failure fails the task
            out.chunks.append(inflight.popleft().result())
    return out


def _all_chunks(messages) -> list[Chunk]:
    return [c for m in messages if isinstance(m, LmqCommitMessage) for c in m.chunks]


def _end(opts: SinkOptions, chunks: list[Chunk], commit: bool) -> None:
    """END_TRANSACTION of every chunk. On a lost broker the chunks go to the new master
    of their broker name (same half offsets: the CommitLog is replicated byte for byte);
    before a commit is sent again, the chunks already in their topic are left out (an
    attempt may have committed them without its answer arriving)."""
    if not chunks:
        return
    client = client_for(opts.namesrv, opts.request_timeout)
    inst = client.instance

    def attempt(n: int) -> None:
        todo = chunks
        if n and commit:
            todo = client.call(uncommitted, inst, chunks)
        client.call(end_chunks, inst, opts.group, todo, commit)

    call_retrying(client, opts.retry_timeout,
                  "committing chunks" if commit else "rolling back chunks", attempt)


# -- writers -------------------------------------------------------------------------------


class LmqBatchWriter(DataSourceArrowWriter):
    """All or nothing: the rows become visible when the job commits."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.idx = check_columns(schema, opts)
        self.job = "batch-" + uuid.uuid4().hex

    def write(self, iterator: Iterator) -> LmqCommitMessage:
        return write_chunks(self.opts, self.idx, iterator, self.job, 0)

    def commit(self, messages) -> None:
        _end(self.opts, _all_chunks(messages), True)

    def abort(self, messages) -> None:
        _end(self.opts, _all_chunks(messages), False)


def _query_id_from_checkpoint(checkpoint: str | None) -> str:
    if not checkpoint:
        raise LmqOptionError("the lmq streaming sink needs a checkpointLocation (or 'lmq.queryId')")
    path = checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError):
        raise LmqOptionError(f"cannot read the query id from {checkpoint}/metadata; set the "
                             "option 'lmq.queryId' to a name unique to this query") from None


class LmqStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once micro-batches (see the module docstring)."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.idx = check_columns(schema, opts)
        self.query = opts.query_id or _query_id_from_checkpoint(opts.checkpoint)

    def write(self, iterator: Iterator) -> LmqCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        return write_chunks(self.opts, self.idx, iterator, self.query,
                            int(batch) if batch is not None else -1)

    def commit(self, messages, batchId: int) -> None:
        opts = self.opts
        chunks = _all_chunks(messages)
        if not chunks:
            # Nothing written: no record needed (a re-run of the batch reads the same
            # offsets, so it writes nothing either; were it to, it would find no record
            # and commit as a first run).
            return
        client = client_for(opts.namesrv, opts.request_timeout)
        inst = client.instance
        budget = opts.retry_timeout
        record = retrying(client, budget, "reading the commit record", find_record, inst,
                          opts.commit_topic, self.query, batchId)
        if record is not None:
            log.warning("lmq sink: batch %d of query %s was committed before; dropping the "
                        "replay", batchId, self.query)
            _end(opts, chunks, False)
            _end(opts, retrying(client, budget, "reading committed chunks", uncommitted,
                                inst, chunks_of(record)), True)
            return
        producer = _producer(opts)
        # Repeating it may store the record twice: both copies list the same chunks.
        retrying(client, budget, "storing the commit record", write_record, inst,
                 producer.target, opts.commit_topic, self.query, batchId, chunks)
        _end(opts, chunks, True)

    def abort(self, messages, batchId: int) -> None:
        _end(self.opts, _all_chunks(messages), False)
