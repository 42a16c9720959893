"""Exchange and queue declarations shared by every AMQP gateway of a cluster
(docs/amqp.md "Several gateways").

Bindings are routes of the shared routing table (gateway/routing); declarations travel the
same way, on a log of their own: topic `LMQ_AMQP_DECL` (one queue) on the broker. A gateway
that declares a (non-exclusive) queue or an exchange, or deletes one, appends a record;
every gateway tails the log (long-polling pulls) and applies the others' records: a
declared queue or exchange is adopted as it was declared, a deleted one is forgotten
(its consumers here get Basic.Cancel). A gateway replays the whole log before it listens,
so a queue declared anywhere is served everywhere.

Records are small JSON objects: `{"o": "q+"|"q-"|"x+"|"x-", "v": vhost, "n": name, "g":
gateway id, ...}` with the declaration's flags and arguments for `q+` / `x+`. The first
declaration of a name in the log is the one every other gateway adopts; a gateway that
raced it with other arguments keeps its own until it redeclares (a window of one pull).

Compaction: a topic cannot be rewritten, so the log is cut by snapshots. After
`snapshot_every` records since the last snapshot (or when the last one is older than
`SNAPSHOT_MAX_AGE_S`, so store retention never removes the only copy of a declaration), a
gateway appends a snapshot of every live declaration it knows (`{"o": "s", "id", "i"
part, "last", "u": the log offset it had applied, "r": [q+/x+ records]}`, in parts of at
most `SNAPSHOT_PART_BYTES`) and then points the consumer offset of group
`GID_AMQP_DECL_SNAPSHOT` at its first part. A starting gateway reads the snapshot there,
then replays from `u` (records between `u` and the snapshot are applied again, in log
order; adopting and forgetting are idempotent), instead of from the log's beginning; the
records before the snapshot age out with the store's retention. A snapshot that cannot be
read whole is ignored (full replay). Gateways without this code skip snapshot records.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import trio

from core.client import MessageQueue, PullStatus
from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.errors import RemotingError

if TYPE_CHECKING:
    from gateway.amqp.broker import AmqpBroker

__all__ = ["DeclLog", "DECL_TOPIC", "MAX_RECORD_BYTES"]

log = logging.getLogger(__name__)

DECL_TOPIC = "LMQ_AMQP_DECL"
#: A record larger than this (arguments included) is not shared (logged).
MAX_RECORD_BYTES = 64 * 1024
#: Records after which a gateway writes a snapshot (AmqpBrokerConfig.decl_snapshot_every).
SNAPSHOT_EVERY = 10_000
#: A snapshot older than this is written again (below the store's 72 h retention).
SNAPSHOT_MAX_AGE_S = 24 * 3600.0
#: Most octets of one snapshot record (a snapshot is as many records as it needs).
SNAPSHOT_PART_BYTES = 256 * 1024
#: Consumer group whose offset points at the latest snapshot.
SNAPSHOT_GROUP = "GID_AMQP_DECL_SNAPSHOT"
_PULL_BATCH = 32
_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)


class DeclLog:
    """The declaration log of one gateway process (its root `AmqpBroker`)."""

    def __init__(self, broker: AmqpBroker, gateway_id: str, *, suspend_ms: int = 1000,
                 group: str = "GID_AMQP_DECL", retry_delay_s: float = 0.5,
                 snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self.broker = broker
        self.gateway_id = gateway_id
        self.suspend_ms = suspend_ms
        self.group = group
        self.retry_delay_s = retry_delay_s
        self.offset = 0
        self.applied = 0  # records of other gateways applied
        self.replayed = 0  # records read before serving (start-up replay)
        self.read = 0  # records read by the follower
        self.snapshot_every = snapshot_every
        self.since_snapshot = 0  # records in the log after the latest snapshot
        self.snapshot_at = time.time()  # wall time of the latest snapshot (or start)
        self.snapshots = 0  # written by this gateway
        self._out: list[bytes] = []
        self._out_ready = trio.Event()
        #: Set (and replaced) each time the follower moves `offset` (presence.py waits).
        self.moved = trio.Event()

    # ------------------------------------------------------------------ writing
    def _encode(self, op: str, vhost: str, name: str, fields: dict[str, Any]) -> bytes | None:
        record = {"o": op, "v": vhost, "n": name, "g": self.gateway_id, **fields}
        try:
            body = json.dumps(record, default=_plain).encode()
        except (TypeError, ValueError) as exc:
            log.warning("AMQP declaration of %r not shared: %s", name, exc)
            return None
        if len(body) > MAX_RECORD_BYTES:
            log.warning("AMQP declaration of %r not shared: %d bytes", name, len(body))
            return None
        return body

    def append(self, op: str, vhost: str, name: str, **fields: Any) -> None:
        """Queue a record for the writer task (in order; not waited for)."""
        body = self._encode(op, vhost, name, fields)
        if body is not None:
            self._out.append(body)
            self._out_ready.set()

    async def write(self, op: str, vhost: str, name: str, **fields: Any) -> int | None:
        """Append a record now (not behind the writer's queue); its log offset."""
        body = self._encode(op, vhost, name, fields)
        return None if body is None else await self._send(body)

    async def _send(self, body: bytes) -> int | None:
        """Append one record (three tries); its log offset, None when it failed."""
        b = self.broker
        ext = {"a": self.group, "b": DECL_TOPIC, "c": "TBW102", "d": "1", "e": "0", "f": "0",
               "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0", "k": "false",
               "m": "false"}
        mq = MessageQueue(DECL_TOPIC, b.broker_name, 0)
        for _ in range(3):
            try:
                result = await b.client.api.send_message(b.addr, mq, dict(ext), body,
                                                         batch=False, uniq_id="")
                return result.queue_offset if result is not None else None
            except _ERRORS as exc:
                log.warning("AMQP declaration log write failed: %r", exc)
                await trio.sleep(self.retry_delay_s)
        return None

    async def _writer(self) -> None:
        while True:
            # Wakes at least hourly to keep a snapshot younger than SNAPSHOT_MAX_AGE_S.
            with trio.move_on_after(3600):
                await self._out_ready.wait()
            self._out_ready = trio.Event()
            pending, self._out = self._out, []
            for body in pending:
                await self._send(body)
            if self.since_snapshot >= self.snapshot_every or \
                    time.time() - self.snapshot_at > SNAPSHOT_MAX_AGE_S:
                try:
                    await self.write_snapshot()
                except _ERRORS as exc:
                    log.warning("AMQP declaration snapshot failed: %r", exc)

    # ------------------------------------------------------------------ snapshots
    def _live(self) -> list[dict[str, Any]]:
        """Every declaration this gateway knows, as q+ / x+ records."""
        from gateway.amqp.broker import PREDEFINED  # it imports this module

        root = self.broker
        out: list[dict[str, Any]] = []
        for b in (root, *root._vhosts.values()):
            for x in b.exchanges.values():
                if x.name not in PREDEFINED:
                    out.append({"o": "x+", "v": b.vhost, "n": x.name, "t": x.type,
                                "d": x.durable, "ad": x.auto_delete, "i": x.internal,
                                "a": x.arguments})
            for q in b.queues.values():
                if not q.exclusive:
                    out.append({"o": "q+", "v": b.vhost, "n": q.name, "d": q.durable,
                                "ad": q.auto_delete, "a": q.arguments})
        out.extend(root.presence.records())  # consumers and exclusive queues
        return out

    async def write_snapshot(self) -> int | None:
        """Append a snapshot and point SNAPSHOT_GROUP at it; its first part's offset."""
        b = self.broker
        upto = self.offset
        sid = secrets.token_hex(6)
        parts: list[list[bytes]] = [[]]
        size = 0
        for record in self._live():
            try:
                one = json.dumps(record, default=_plain).encode()
            except (TypeError, ValueError):
                continue
            if size + len(one) > SNAPSHOT_PART_BYTES and parts[-1]:
                parts.append([])
                size = 0
            parts[-1].append(one)
            size += len(one) + 1
        first = None
        for i, items in enumerate(parts):
            head = json.dumps({"o": "s", "g": self.gateway_id, "id": sid, "i": i,
                               "last": i == len(parts) - 1, "u": upto}).encode()
            body = head[:-1] + b', "r": [' + b",".join(items) + b"]}"
            offset = await self._send(body)
            if offset is None:
                return None  # an incomplete snapshot is never pointed at
            if first is None:
                first = offset
        await b.client.api.update_consumer_offset(b.addr, SNAPSHOT_GROUP, DECL_TOPIC, 0, first)
        self.since_snapshot = 0
        self.snapshot_at = time.time()
        self.snapshots += 1
        log.info("AMQP declaration snapshot: %d records in %d parts at log offset %d "
                 "(applied up to %d)", sum(map(len, parts)), len(parts), first, upto)
        return first

    async def _load_snapshot(self, at: int) -> int | None:
        """Apply the snapshot whose first part is at offset `at`; the offset to replay
        from, or None when it cannot be read whole (nothing applied then)."""
        self.offset = at
        sid = None
        items: list[dict[str, Any]] = []
        upto = None
        while upto is None:
            got = await self._pull(0)
            if got.status is not PullStatus.FOUND or not got.messages:
                return None
            for msg in got.messages:
                self.replayed += 1
                try:
                    r = json.loads(msg.body)
                    if r.get("o") != "s" or (sid is not None and r.get("id") != sid):
                        if sid is None:
                            return None  # the pointer is not at a snapshot's first part
                        continue
                    if sid is None:
                        if r.get("i") != 0:
                            return None
                        sid = r["id"]
                    items.extend(r["r"])
                    if r.get("last"):
                        upto = int(r["u"])
                        break
                except (ValueError, TypeError, AttributeError, KeyError) as exc:
                    log.warning("AMQP declaration snapshot unreadable: %r", exc)
                    return None
            self.offset = got.next_begin_offset
        for r in items:
            try:
                await self._apply(r)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                log.warning("AMQP declaration snapshot record skipped: %r", exc)
        return upto

    # ------------------------------------------------------------------ reading
    async def _pull(self, suspend_ms: int):
        b = self.broker
        flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
        ext = {"consumerGroup": self.group, "topic": DECL_TOPIC, "queueId": "0",
               "queueOffset": str(self.offset), "maxMsgNums": str(_PULL_BATCH),
               "sysFlag": str(int(flag)), "commitOffset": "0",
               "suspendTimeoutMillis": str(suspend_ms), "subscription": "*",
               "subVersion": "0", "expressionType": "TAG"}
        timeout = suspend_ms / 1000.0 + b.client.config.request_timeout
        return await b.client.api.pull_message(b.addr, ext, timeout)

    async def _apply_some(self, suspend_ms: int) -> bool:
        got = await self._pull(suspend_ms)
        if got.status is PullStatus.OFFSET_ILLEGAL:
            self.offset = max(got.next_begin_offset, got.min_offset)
            return True
        if got.status is not PullStatus.FOUND:
            return False
        for msg in got.messages:
            self.read += 1
            self.since_snapshot += 1
            try:
                record = json.loads(msg.body)
                if record.get("o") == "s":
                    if record.get("last"):
                        self.since_snapshot = 0
                        self.snapshot_at = msg.store_timestamp / 1000.0
                    continue
                if record.get("g") != self.gateway_id:
                    await self._apply(record)
                    self.applied += 1
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                log.warning("AMQP declaration record skipped: %r", exc)
        self.offset = got.next_begin_offset
        self.moved.set()
        self.moved = trio.Event()
        return True

    async def _apply(self, r: dict[str, Any]) -> None:
        broker = self.broker.for_vhost(str(r["v"]))
        op, name = r["o"], str(r["n"])
        if op == "q+":
            broker.adopt_queue(name, bool(r.get("d")), bool(r.get("ad")), r.get("a") or {})
        elif op == "q-":
            await broker.forget_queue(name)
        elif op == "x+":
            broker.adopt_exchange(name, str(r.get("t", "direct")), bool(r.get("d")),
                                  bool(r.get("ad")), bool(r.get("i")), r.get("a") or {})
        elif op == "x-":
            await broker.forget_exchange(name)
        else:  # consumers, exclusive queues (presence.py); it skips other ops
            broker.presence.apply(broker, r)

    async def replay(self) -> None:
        """Start-up: the latest snapshot (if any), then the log to its end."""
        b = self.broker
        pointer = await b.client.api.query_consumer_offset(b.addr, SNAPSHOT_GROUP,
                                                           DECL_TOPIC, 0)
        upto = await self._load_snapshot(pointer) if pointer >= 0 else None
        self.offset = upto if upto is not None else 0
        before = self.read
        while await self._apply_some(0):
            pass
        self.replayed += self.read - before

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Create the topic, replay the log to its end, then follow it."""
        b = self.broker
        await b.client.api.create_topic(b.addr, DECL_TOPIC, 1, 1)
        await self.replay()
        if self.since_snapshot >= self.snapshot_every:
            self._out_ready.set()  # a long log and no recent snapshot: write one now
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            task_status.started()
            while True:
                try:
                    await self._apply_some(self.suspend_ms)
                except _ERRORS as exc:
                    log.warning("AMQP declaration log pull failed: %r", exc)
                    await trio.sleep(self.retry_delay_s)


def _plain(value: Any) -> Any:
    """Field-table values JSON has no type for (bytes, Decimal, Timestamp...) as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)
