"""`spark.read.format("lmq")` and `spark.readStream.format("lmq")` (docs/spark.md).

One Spark partition per (topic, broker, queue) with messages in the offset range
[start, end); a range is read by pulls from its start offset, so the same range yields
the same rows after a restart (Spark's offset log holds the ranges: exactly-once input).
Offsets, in the offset log and in ``startingOffsets`` / ``endingOffsets``, are JSON
``{"Topic": {"broker-a/0": 12, ...}}``: the next queue offset to read per queue.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import trio
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from core.client.model import MessageQueue, PullStatus
from core.client.pull_consumer import PullConsumer, broker_addr_for
from core.common.names import (
    TOPIC_MAX_LENGTH,
    is_dlq_topic,
    is_lmq,
    is_retry_topic,
    is_system_topic,
)
from core.common.properties import MessageConst
from spark_sinks.conn import client_for, request_pool
from spark_sinks.options import EARLIEST, LATEST, LmqDataLossError, SourceOptions
from spark_sinks.retry import call_retrying, retryable, retrying
from spark_sinks.rows import mqtt_topic_of, to_record_batch

log = logging.getLogger(__name__)

#: Consumer group named in pull requests (nothing is committed under it).
READER_GROUP = "SPARK_LMQ_READER"
#: Pulls a partition reader keeps in flight (_Prefetch).
PULL_WINDOW = 4

Key = tuple[str, str, int]  # (topic, broker name, queue id)


def _qkey(broker: str, qid: int) -> str:
    return f"{broker}/{qid}"


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One partition: the messages of one queue with start <= queueOffset < end.
    `start` may be EARLIEST (a queue first seen in this batch: its oldest message)."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int


# -- driver side: queue discovery and offset resolution ---------------------------------


async def _pin_brokers(instance) -> dict[str, str]:
    """Learn every master broker (an LMQ has no route to find them by); name -> address."""
    info = await instance.api.get_cluster_info()
    masters = info.master_addrs()
    instance.pin_brokers({name: info.brokers[name].broker_addrs for name in masters})
    return masters


async def _bounds(instance, topics: list[str], lows: bool = True) -> dict[Key, tuple[int, int]]:
    """(min offset, max offset) of every readable queue of `topics`; an LMQ (amqpQueue) has
    one queue, 0, on every master broker. The requests go out side by side (one round trip
    per trigger, not two per queue); without `lows` the min offsets are not asked for
    (reported as 0): a streaming trigger needs only the ends."""
    pc = PullConsumer(instance, READER_GROUP)
    keys: list[Key] = []
    masters: dict[str, str] = {}
    for topic in topics:
        if is_lmq(topic):
            masters = masters or await _pin_brokers(instance)
            keys += [(topic, name, 0) for name in sorted(masters)]
            continue
        route = await instance.update_route(topic)
        if route is None:
            continue  # no such topic yet: no queues, nothing to read
        keys += [(topic, mq.broker_name, mq.queue_id) for mq in route.subscribe_queues(topic)]
    out: dict[Key, list[int]] = {k: [0, 0] for k in keys}

    async def one(key: Key, low: bool) -> None:
        topic, name, qid = key
        if is_lmq(topic):
            addr = masters[name]
            get = instance.api.get_min_offset if low else instance.api.get_max_offset
            out[key][0 if low else 1] = await get(addr, topic, 0)
        else:
            mq = MessageQueue(topic, name, qid)
            out[key][0 if low else 1] = await (pc.min_offset(mq) if low else pc.max_offset(mq))

    try:
        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key, False)
                if lows:
                    nursery.start_soon(one, key, True)
    except BaseExceptionGroup as group:
        # One error for the caller, as when the requests went one by one: the first that
        # is not worth a retry (retry.py), else the first.
        errors = group.exceptions
        raise next((e for e in errors if not retryable(e)), errors[0]) from None
    return {k: (lo, hi) for k, (lo, hi) in out.items()}


def _plain_topic(topic: str) -> bool:
    return not (is_system_topic(topic) or is_retry_topic(topic) or is_dlq_topic(topic)
                or is_lmq(topic) or topic.startswith("RMQ_SYS_"))


def topics_of(opts: SourceOptions) -> list[str]:
    """The topics to read: `subscribe`, or the name server's topic list filtered by
    `subscribePattern` (whole-name match; system, retry, DLQ and LMQ names left out). The
    regex runs here in the caller's thread, never on the client's event loop; topic names
    are at most 127 characters and the pattern at most MAX_PATTERN_CHARS."""
    if opts.pattern is None:
        return list(opts.topics)
    client = client_for(opts.namesrv, opts.request_timeout)
    names = client.call(client.instance.api.get_all_topic_list)
    return [t for t in names if len(t) <= TOPIC_MAX_LENGTH and _plain_topic(t)
            and opts.pattern.fullmatch(t)]


def queue_bounds(opts: SourceOptions, lows: bool = True) -> dict[Key, tuple[int, int]]:
    client = client_for(opts.namesrv, opts.request_timeout)
    return retrying(client, opts.retry_timeout, "reading queue bounds", _bounds,
                    client.instance, topics_of(opts), lows)


async def _by_time(instance, keys: list[Key], timestamp_ms: int) -> dict[Key, int]:
    pc = PullConsumer(instance, READER_GROUP)
    return {k: await pc.search_offset(MessageQueue(*k), timestamp_ms) for k in keys}


def starting_offsets(opts: SourceOptions, bounds: dict[Key, tuple[int, int]]) -> dict[Key, int]:
    """Where reading starts per queue: `startingTimestamp` (the broker's search by store
    time: the first message stored at or after it, the queue's end if none) or
    `startingOffsets`."""
    if opts.starting_ts is None:
        return resolve(opts.starting, bounds, EARLIEST)
    client = client_for(opts.namesrv, opts.request_timeout)
    found = retrying(client, opts.retry_timeout, "searching offsets by time", _by_time,
                     client.instance, sorted(bounds), opts.starting_ts)
    return {k: min(max(found[k], lo), hi) for k, (lo, hi) in bounds.items()}


async def _commit_group(instance, group: str, offsets: dict[Key, int]) -> None:
    for (topic, broker, qid), off in sorted(offsets.items()):
        addr = await broker_addr_for(instance, MessageQueue(topic, broker, qid))
        await instance.api.update_consumer_offset(addr, group, topic, qid, off)


def commit_group(opts: SourceOptions, offsets: dict[Key, int]) -> None:
    """Store `offsets` as `commitGroup`'s consumer offsets (a failure is logged: Spark's
    own offset log stays the truth, the group's offsets are for monitoring)."""
    client = client_for(opts.namesrv, opts.request_timeout)
    try:
        client.call(_commit_group, client.instance, opts.commit_group, offsets)
    except Exception as exc:
        log.warning("lmq source: committing offsets of group %s failed: %s",
                    opts.commit_group, exc)


def _spec_for(spec: dict, key: Key) -> int | None:
    per = spec.get(key[0])
    if per is None:
        return None
    v = per.get(_qkey(key[1], key[2]))
    return per.get(str(key[2])) if v is None else v


def resolve(spec: int | dict, bounds: dict[Key, tuple[int, int]], default: int) -> dict[Key, int]:
    """Concrete offsets for every queue: EARLIEST = min offset, LATEST = max offset; queues a
    JSON spec leaves out get `default`."""
    out = {}
    for key, (lo, hi) in bounds.items():
        v = spec if isinstance(spec, int) else _spec_for(spec, key)
        if v is None:
            v = default
        out[key] = lo if v == EARLIEST else hi if v == LATEST else v
    return out


def to_json(offsets: dict[Key, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, broker, qid), off in sorted(offsets.items()):
        out.setdefault(topic, {})[_qkey(broker, qid)] = off
    return out


def from_json(obj: dict) -> dict[Key, int]:
    out = {}
    for topic, per in obj.items():
        for q, off in per.items():
            broker, _, qid = q.rpartition("/")
            out[(topic, broker, int(qid))] = int(off)
    return out


def split_limit(start: dict[Key, int], latest: dict[Key, int], limit: int) -> dict[Key, int]:
    """End offsets that admit at most `limit` messages in all, shared among the queues in
    proportion to their backlog (largest remainders get the leftovers)."""
    backlog = {k: max(0, latest[k] - start.get(k, 0)) for k in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares = {k: limit * b / total for k, b in backlog.items()}
    take = {k: int(s) for k, s in shares.items()}
    left = limit - sum(take.values())
    for k in sorted(shares, key=lambda k: (take[k] - shares[k], k))[:left]:
        take[k] += 1
    return {k: start.get(k, 0) + take[k] for k in latest}


@dataclass(frozen=True)
class RangeGroup(InputPartition):
    """One partition of a small batch: several queues' ranges, read one after another."""

    ranges: tuple[QueueRange, ...]


def make_partitions(start: dict[Key, int], end: dict[Key, int],
                    small_rows: int = 0) -> list[QueueRange] | list[RangeGroup]:
    """One partition per queue with messages in [start, end); when they total at most
    `small_rows` messages (and every start is known), all of them in one RangeGroup: a
    small micro-batch is one Spark task instead of one per queue. The grouping depends only
    on the offsets, so a batch re-run from the offset log is split the same way."""
    parts = []
    for key in sorted(end):
        s = start.get(key, EARLIEST)
        if s == EARLIEST or end[key] > s:
            parts.append(QueueRange(key[0], key[1], key[2], s, end[key]))
    if len(parts) > 1 and all(p.start != EARLIEST for p in parts) \
            and sum(p.end - p.start for p in parts) <= small_rows:
        return [RangeGroup(tuple(parts))]
    return parts


def read_partition(opts: SourceOptions, partition) -> Iterator:
    if isinstance(partition, RangeGroup):
        for part in partition.ranges:
            yield from read_range(opts, part)
    elif isinstance(partition, QueueRange):
        yield from read_range(opts, partition)
    # anything else: no ranges, Spark reads one empty partition


# -- executor side: reading one range --------------------------------------------------------


def _data_loss(opts: SourceOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise LmqDataLossError(
            f"{what}; the messages were deleted (retention) or the queue was reset. "
            "Set failOnDataLoss=false to skip such ranges with a warning.")
    log.warning("lmq source skips lost messages: %s", what)


class _Prefetch:
    """Pulls of a range kept PULL_WINDOW in flight: while the task converts one pull's
    messages, the next pulls (at the offsets that follow if every pull returns all it asked
    for, as it does on a dense queue) are on their way. A pull at another offset than
    predicted (a short answer, a gap) drops the predictions and starts again there."""

    def __init__(self, pc, mq: MessageQueue, batch: int, end: int) -> None:
        self.pc, self.mq, self.batch, self.end = pc, mq, batch, end
        self.pool = request_pool()
        self.inflight: deque = deque()
        self.next = -1

    def pull(self, offset: int):
        try:
            return self._pull(offset)
        except Exception:
            self.inflight.clear()  # pulls sent to a lost broker: sent again when retried
            raise

    def _pull(self, offset: int):
        q = self.inflight
        if not q or q[0][0] != offset:
            q.clear()  # answers of dropped predictions are ignored
            self.next = offset
        while len(q) < PULL_WINDOW and self.next < self.end:
            n = min(self.batch, self.end - self.next)
            q.append((self.next, self.pool.submit(self.pc.pull, self.mq, None, self.next, n)))
            self.next += n
        return q.popleft()[1].result()


def _as_lmq(msgs: list, lmq: str, first: int) -> list:
    """Messages pulled from an LMQ, as rows of it: topic = the LMQ, queue 0, queueOffset =
    the message's offset in the LMQ (from INNER_MULTI_QUEUE_OFFSET; else counted from the
    pull's offset)."""
    for i, m in enumerate(msgs):
        off = first + i
        names = m.properties.get(MessageConst.INNER_MULTI_DISPATCH)
        offsets = m.properties.get(MessageConst.INNER_MULTI_QUEUE_OFFSET)
        if names and offsets:
            sep = MessageConst.MULTI_DISPATCH_SEPARATOR
            for name, o in zip(names.split(sep), offsets.split(sep), strict=False):
                if name == lmq and o.isdigit():
                    off = int(o)
                    break
        m.topic, m.queue_id, m.queue_offset = lmq, 0, off
    return msgs


def read_range(opts: SourceOptions, part: QueueRange) -> Iterator:
    """Arrow record batches of the messages in `part` (filtered by `mqttTopic` if set)."""
    client = client_for(opts.namesrv, opts.request_timeout)
    pc = client.pull_consumer(READER_GROUP)
    mq = MessageQueue(part.topic, part.broker, part.queue_id)
    lmq = is_lmq(part.topic)
    budget = opts.retry_timeout
    if lmq and client.instance.find_subscribe_addr(part.broker) is None:
        retrying(client, budget, "reading the brokers", _pin_brokers, client.instance)
    offset, end = part.start, part.end
    if offset == EARLIEST:
        offset = min(call_retrying(client, budget, f"reading {mq}",
                                   lambda _n: pc.min_offset(mq)), end)
    elif end < offset:
        _data_loss(opts, f"{mq}: end offset {end} is below start offset {offset}")
        return
    flt = opts.mqtt_filter
    if flt is not None:
        from spark_sinks.mqtt import topic_matches
    ahead = _Prefetch(pc, mq, opts.pull_batch, end)
    while offset < end:
        # A pull is a read: repeating it (on the new master, or a slave meanwhile) is safe.
        res = call_retrying(client, budget, f"pulling {mq}",
                            lambda _n, at=offset: ahead.pull(at))
        if res.status is PullStatus.FOUND and res.messages:
            msgs = _as_lmq(res.messages, part.topic, offset) if lmq else res.messages
            first = msgs[0].queue_offset
            if first > offset:
                _data_loss(opts, f"{mq}: offsets {offset}..{first - 1} are gone")
            msgs = [m for m in msgs if m.queue_offset < end]
            offset = max(offset + 1, msgs[-1].queue_offset + 1 if msgs else end)
            if flt is not None:
                msgs = [m for m in msgs
                        if (t := mqtt_topic_of(m.properties)) is not None and topic_matches(flt, t)]
            if msgs:
                yield to_record_batch(msgs, part.broker, opts.include_headers)
            continue
        nxt = res.next_begin_offset
        if res.status is PullStatus.OFFSET_ILLEGAL or nxt > offset or res.min_offset > offset:
            new = max(nxt, res.min_offset)
            if new <= offset:
                raise LmqDataLossError(f"{mq}: offset {offset} is illegal (queue {res.min_offset}"
                                       f"..{res.max_offset})")
            _data_loss(opts, f"{mq}: offsets {offset}..{min(new, end) - 1} are gone")
            offset = new
            continue
        # NO_NEW_MSG below `end`: the queue shrank (broker data reset) — nothing more to read.
        _data_loss(opts, f"{mq}: offsets {offset}..{end - 1} are not in the queue "
                         f"(max offset {res.max_offset})")
        return


# -- readers ---------------------------------------------------------------------------------


class LmqBatchReader(DataSourceReader):
    """Batch read of the ranges fixed when the query is planned."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        bounds = queue_bounds(opts)
        start = starting_offsets(opts, bounds)
        end = resolve(opts.ending, bounds, LATEST)
        self.ranges = make_partitions(start, end, opts.small_batch_rows)

    def partitions(self) -> list[QueueRange] | list[RangeGroup]:
        return self.ranges

    def read(self, partition: QueueRange | RangeGroup) -> Iterator:
        return read_partition(self.opts, partition)


class LmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader with admission control (`maxOffsetsPerTrigger`)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._until: dict[Key, int] | None = None  # set by Trigger.AvailableNow
        self._group_at: dict[Key, int] | None = None  # last offsets stored for commitGroup
        self._reported: dict[Key, int] | None = None  # ends read by the last latestOffset

    def initialOffset(self) -> dict:
        return to_json(starting_offsets(self.opts, queue_bounds(self.opts)))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_trigger:
            return ReadMaxRows(self.opts.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = {k: hi for k, (_lo, hi) in queue_bounds(self.opts).items()}

    def _latest(self) -> dict[Key, int]:
        latest = {k: hi for k, (_lo, hi) in queue_bounds(self.opts, lows=False).items()}
        self._reported = latest
        if self._until is not None:
            latest = {k: min(v, self._until.get(k, v)) for k, v in latest.items()
                      if k in self._until}
        return latest

    def _commit_group(self, offsets: dict[Key, int]) -> None:
        if self.opts.commit_group and offsets != self._group_at:
            commit_group(self.opts, offsets)
            self._group_at = offsets

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        # `start` is the end of a batch Spark has finished (one batch runs at a time, and a
        # restarted query re-runs its unfinished batch before planning the next): store it
        # for commitGroup here too, since Spark calls commit() only when it plans a batch.
        self._commit_group(begin)
        latest = self._latest()
        for k, v in begin.items():  # never move a queue backwards; keep vanished queues
            latest[k] = max(latest.get(k, v), v)
        if isinstance(limit, ReadMaxRows):
            latest = split_limit(begin, latest, int(limit.max_rows))
        return to_json(latest)

    def reportLatestOffset(self) -> dict:
        # Spark asks right after latestOffset: the ends that call read (no second round).
        latest, self._reported = self._reported, None
        if latest is None:
            latest = {k: hi for k, (_lo, hi) in queue_bounds(self.opts, lows=False).items()}
        return to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[QueueRange] | list[RangeGroup]:
        return make_partitions(from_json(start), from_json(end), self.opts.small_batch_rows)

    def read(self, partition: QueueRange | RangeGroup) -> Iterator:
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        self._commit_group(from_json(end))
