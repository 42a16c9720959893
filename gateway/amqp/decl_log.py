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
"""

from __future__ import annotations

import json
import logging
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
_PULL_BATCH = 32
_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)


class DeclLog:
    """The declaration log of one gateway process (its root `AmqpBroker`)."""

    def __init__(self, broker: AmqpBroker, gateway_id: str, *, suspend_ms: int = 1000,
                 group: str = "GID_AMQP_DECL", retry_delay_s: float = 0.5) -> None:
        self.broker = broker
        self.gateway_id = gateway_id
        self.suspend_ms = suspend_ms
        self.group = group
        self.retry_delay_s = retry_delay_s
        self.offset = 0
        self.applied = 0  # records of other gateways applied
        self._out: list[bytes] = []
        self._out_ready = trio.Event()

    # ------------------------------------------------------------------ writing
    def append(self, op: str, vhost: str, name: str, **fields: Any) -> None:
        """Queue a record for the writer task (in order; not waited for)."""
        record = {"o": op, "v": vhost, "n": name, "g": self.gateway_id, **fields}
        try:
            body = json.dumps(record, default=_plain).encode()
        except (TypeError, ValueError) as exc:
            log.warning("AMQP declaration of %r not shared: %s", name, exc)
            return
        if len(body) > MAX_RECORD_BYTES:
            log.warning("AMQP declaration of %r not shared: %d bytes", name, len(body))
            return
        self._out.append(body)
        self._out_ready.set()

    async def _writer(self) -> None:
        b = self.broker
        ext = {"a": self.group, "b": DECL_TOPIC, "c": "TBW102", "d": "1", "e": "0", "f": "0",
               "h": "0", "i": "", "j": "0", "k": "false", "m": "false"}
        mq = MessageQueue(DECL_TOPIC, b.broker_name, 0)
        while True:
            await self._out_ready.wait()
            self._out_ready = trio.Event()
            pending, self._out = self._out, []
            for body in pending:
                ext["g"] = str(int(time.time() * 1000))
                for _ in range(3):
                    try:
                        await b.client.api.send_message(b.addr, mq, dict(ext), body,
                                                        batch=False, uniq_id="")
                        break
                    except _ERRORS as exc:
                        log.warning("AMQP declaration log write failed: %r", exc)
                        await trio.sleep(self.retry_delay_s)

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
            try:
                record = json.loads(msg.body)
                if record.get("g") != self.gateway_id:
                    await self._apply(record)
                    self.applied += 1
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                log.warning("AMQP declaration record skipped: %r", exc)
        self.offset = got.next_begin_offset
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

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Create the topic, replay the log to its end, then follow it."""
        b = self.broker
        await b.client.api.create_topic(b.addr, DECL_TOPIC, 1, 1)
        while await self._apply_some(0):
            pass
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
