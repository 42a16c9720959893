"""Consumers and exclusive queues across the gateways of a cluster (docs/amqp.md
"Single active consumer and x-expires across gateways", "Consumers, auto-delete and
exclusive queues").

Every gateway writes, on the declaration log (decl_log.py), how many consumers it has of a
queue and whether one of them is exclusive (record `{"o": "c", "c": count, "x": bool}`)
whenever that changes; every gateway follows the log, so it knows the others' consumers
without asking. From that:

- **Declare-Ok's consumer count** (and Queue.Delete if-unused) counts every gateway's.
- **Exclusive consume.** A Basic.Consume writes its gateway's new count first and waits
  until its follower has read the log past that record, then looks: an exclusive consume
  is refused (403) if another gateway has a consumer, a plain one if another gateway has
  an exclusive one. The log orders the records, so of two consumes that conflict the later
  one sees the earlier (both may be refused when they cross; none is wrongly admitted).
- **Auto-delete.** When a gateway's last consumer of an auto-delete queue goes, it writes
  0, waits for its record to come back, and deletes the queue only if no other gateway
  has a consumer (under the queue's deletion lock, expiry.py, so it is deleted once).
- **Exclusive queues** are written to the log too (`"qe+"`, with the owner gateway): the
  other gateways answer 405 RESOURCE_LOCKED for them, as RabbitMQ does for another
  connection's exclusive queue, and route publishes to them.

A gateway killed with -9 writes nothing more. The others read the gateways' group
(GET_CONSUMER_LIST_BY_GROUP) every `presence_check_s` while they know another gateway's
consumers or exclusive queues; one out of the group for `presence_gone_s` (longer than the
route log's heartbeat interval, so a gateway whose broker connection only blipped is back
by then) is gone: its consumers stop counting, its exclusive queues are deleted and so are
auto-delete queues left without consumers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import trio

from core.client.errors import MQBrokerError, MQClientError
from core.remoting.errors import RemotingError
from gateway.amqp import errors
from gateway.amqp.errors import AmqpError
from gateway.amqp.expiry import DELETE_LOCK

if TYPE_CHECKING:
    from gateway.amqp.broker import AmqpBroker, Queue

__all__ = ["Presence", "CONSUMERS_OP", "EXCLUSIVE_QUEUE_OP", "APPLIED_WAIT_S"]

log = logging.getLogger(__name__)

#: Declaration-log operations of this module (gateways of an earlier version skip them).
CONSUMERS_OP = "c"
EXCLUSIVE_QUEUE_OP = "qe+"
#: How long a consume (or an auto-delete check) waits for its own record to come back on
#: the log before it decides on what it knows.
APPLIED_WAIT_S = 5.0
#: The writer's pause after a record it could not write (then it writes the state again).
WRITE_RETRY_S = 1.0
_ERRORS = (MQClientError, RemotingError, OSError, trio.TooSlowError)
Key = tuple[str, str]  # (vhost, queue name)


class Presence:
    """What the gateways of the cluster consume, as this gateway knows it (one per gateway
    process, shared by its virtual hosts)."""

    def __init__(self, broker: AmqpBroker) -> None:
        self.broker = broker
        cfg = broker.config
        self.check_s = cfg.presence_check_s
        self.gone_s = cfg.presence_gone_s
        #: Other gateways' consumers: key -> gateway id -> (count, exclusive).
        self.remote: dict[Key, dict[str, tuple[int, bool]]] = {}
        #: Other gateways' exclusive queues: key -> owner gateway id.
        self.owners: dict[Key, str] = {}
        #: What this gateway wrote last per queue, and consumes being admitted.
        self.announced: dict[Key, tuple[int, bool]] = {}
        self._pending: dict[Key, list[int]] = {}
        self._queues: dict[Key, tuple[AmqpBroker, Queue]] = {}
        self._lock = trio.Lock()
        self._dirty: set[Key] = set()
        self._dirty_ready = trio.Event()
        self._failed = False  # a write failed: the writer pauses before it tries again
        self._absent: dict[str, float] = {}  # gateway -> trio time first seen out
        self.reaped: list[str] = []  # gateways found gone

    @property
    def member(self) -> str:
        """This gateway's id in the gateways' group (the route log's)."""
        return self.broker.routes.gateway_id

    # ------------------------------------------------------------------ reading
    def count(self, broker: AmqpBroker, queue: Queue) -> int:
        """The queue's consumers on every gateway."""
        others = self.remote.get((broker.vhost, queue.name))
        return queue.consumers + (sum(c for c, _ in others.values()) if others else 0)

    def _conflict(self, key: Key, exclusive: bool) -> bool:
        for count, excl in self.remote.get(key, {}).values():
            if excl or (exclusive and count):
                return True
        return False

    # ------------------------------------------------------------------ writing
    def _state(self, key: Key, queue: Queue) -> tuple[int, bool]:
        pending = self._pending.get(key, (0, 0))
        return queue.consumers + pending[0], queue.exclusive_consumer or pending[1] > 0

    async def _write(self, broker: AmqpBroker, queue: Queue) -> int | None:
        """Write the gateway's consumers of `queue` if they changed; the record's log
        offset (None: nothing written)."""
        decl = broker.decl
        if decl is None or queue.exclusive:
            return None
        key = (broker.vhost, queue.name)
        async with self._lock:
            state = self._state(key, queue)
            if self.announced.get(key, (0, False)) == state:
                return None
            self._queues[key] = (broker, queue)
            offset = await decl.write(CONSUMERS_OP, broker.vhost, queue.name, c=state[0],
                                      x=state[1], m=self.member)
            if offset is None:  # not written (logged): tried again by the writer
                self._failed = True
                self.changed(broker, queue)
            else:
                self.announced[key] = state
                if state[0] == 0:
                    self.announced.pop(key, None)
                    self._queues.pop(key, None)
            return offset

    def changed(self, broker: AmqpBroker, queue: Queue) -> None:
        """The gateway's consumers of `queue` changed: written soon (not waited for)."""
        if broker.decl is not None and not queue.exclusive:
            key = (broker.vhost, queue.name)
            self._queues[key] = (broker, queue)
            self._dirty.add(key)
            self._dirty_ready.set()

    async def _settled(self, broker: AmqpBroker, queue: Queue) -> None:
        """Write the gateway's consumers now and wait until the log was read past that
        record: every record written before it is known then."""
        offset = await self._write(broker, queue)
        decl = broker.decl
        if offset is None or decl is None:
            return
        with trio.move_on_after(APPLIED_WAIT_S) as scope:
            while decl.offset <= offset:
                await decl.moved.wait()
        if scope.cancelled_caught:
            log.warning("AMQP declaration log not read back in %.0f s: deciding on queue "
                        "%r with what is known", APPLIED_WAIT_S, queue.name)

    @contextlib.asynccontextmanager
    async def consuming(self, broker: AmqpBroker, queue: Queue,
                        exclusive: bool) -> AsyncIterator[None]:
        """Around a Basic.Consume: refused (403) when another gateway's consumers conflict;
        the new consumer is counted by the others before it starts."""
        local_refusal = queue.exclusive_consumer or (exclusive and queue.consumers)
        if broker.decl is None or queue.exclusive or local_refusal:
            yield  # connection-owned, or refused here anyway (consume.py)
            return
        key = (broker.vhost, queue.name)
        pending = self._pending.setdefault(key, [0, 0])
        pending[0] += 1
        pending[1] += exclusive
        ok = False
        try:
            try:
                await self._settled(broker, queue)
            except _ERRORS as exc:
                raise AmqpError(errors.INTERNAL_ERROR, f"INTERNAL_ERROR - {exc}") from None
            if broker.queues.get(queue.name) is not queue:
                raise AmqpError(errors.NOT_FOUND, f"NOT_FOUND - no queue '{queue.name}' "
                                "in vhost '/'")
            if self._conflict(key, exclusive):
                raise AmqpError(errors.ACCESS_REFUSED, f"ACCESS_REFUSED - queue "
                                f"'{queue.name}' in vhost '/' in exclusive use")
            yield
            ok = True
        finally:
            pending[0] -= 1
            pending[1] -= exclusive
            if not pending[0]:
                self._pending.pop(key, None)
            if not ok:
                self.changed(broker, queue)  # what was written for it is taken back

    async def auto_delete(self, broker: AmqpBroker, queue: Queue) -> None:
        """The gateway's last consumer of auto-delete `queue` went: delete it when no
        gateway has one."""
        if broker.decl is None or queue.exclusive:
            await broker._drop_queue(queue)  # nobody else consumes it
            return
        try:
            await self._settled(broker, queue)
        except _ERRORS as exc:
            log.warning("AMQP consumers of queue %r not shared: %r", queue.name, exc)
        if not self.count(broker, queue) and broker.queues.get(queue.name) is queue:
            await self.delete_once(broker, queue)

    async def run(self) -> None:
        """The writer of unawaited changes and the watch for gone gateways."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            while True:
                await trio.sleep(self.check_s)
                try:
                    await self._check_gone()
                except _ERRORS as exc:
                    log.warning("AMQP check for gone gateways failed: %r", exc)

    async def _writer(self) -> None:
        while True:
            if self._failed:
                self._failed = False
                await trio.sleep(WRITE_RETRY_S)
            await self._dirty_ready.wait()
            self._dirty_ready = trio.Event()
            dirty, self._dirty = self._dirty, set()
            for key in dirty:
                entry = self._queues.get(key)
                if entry is None:
                    continue
                try:
                    await self._write(*entry)
                except _ERRORS as exc:
                    log.warning("AMQP consumers of queue %r not shared: %r", key[1], exc)

    # ------------------------------------------------------------------ the log
    def records(self) -> list[dict[str, Any]]:
        """This module's part of a declaration-log snapshot."""
        out: list[dict[str, Any]] = []
        gateway = self.member
        for b in (self.broker, *self.broker._vhosts.values()):
            for q in b.queues.values():
                if q.exclusive:
                    owner = gateway if q.owner is not None else self.owners.get(
                        (b.vhost, q.name))
                    if owner is not None:
                        out.append({"o": EXCLUSIVE_QUEUE_OP, "v": b.vhost, "n": q.name,
                                    "g": owner, "m": owner, "d": q.durable,
                                    "ad": q.auto_delete, "a": q.arguments})
        for (vhost, name), state in self.announced.items():
            out.append({"o": CONSUMERS_OP, "v": vhost, "n": name, "g": gateway,
                        "m": gateway, "c": state[0], "x": state[1]})
        for (vhost, name), others in self.remote.items():
            for gw, (count, excl) in others.items():
                out.append({"o": CONSUMERS_OP, "v": vhost, "n": name, "g": gw, "m": gw,
                            "c": count, "x": excl})
        return out

    def apply(self, broker: AmqpBroker, r: dict[str, Any]) -> None:
        """Another gateway's record (decl_log.py)."""
        op = r["o"]
        if op not in (CONSUMERS_OP, EXCLUSIVE_QUEUE_OP):
            return  # written by a later version
        # "m": the writer's id in the gateways' group ("g" is its declaration-log id).
        key, gateway = (broker.vhost, str(r["n"])), str(r.get("m") or r["g"])
        if gateway == self.member:
            return  # an earlier life of this gateway id (a snapshot): what it had went
        if op == EXCLUSIVE_QUEUE_OP:
            broker.adopt_queue(key[1], bool(r.get("d")), bool(r.get("ad")), r.get("a") or {},
                               exclusive=True)
            queue = broker.queues.get(key[1])
            if queue is not None and queue.owner is None:
                self.owners[key] = gateway
            return
        count = int(r.get("c") or 0)
        if count > 0:
            self.remote.setdefault(key, {})[gateway] = (count, bool(r.get("x")))
        else:
            others = self.remote.get(key)
            if others is not None:
                others.pop(gateway, None)
                if not others:
                    del self.remote[key]

    def forget(self, broker: AmqpBroker, queue: Queue) -> None:
        """The queue is deleted: its consumers everywhere are cancelled with it. What the
        others wrote before the deletion is forgotten; a count this gateway wrote may
        come after it in the log (a consume that crossed the deletion): written again as
        0, so nobody keeps counting it."""
        key = (broker.vhost, queue.name)
        for table in (self.remote, self.owners):
            table.pop(key, None)
        if self.announced.pop(key, None) is not None or key in self._pending:
            self.announced[key] = (-1, False)  # differs from anything: written again
            self.changed(broker, queue)

    # ------------------------------------------------------------------ gone gateways
    async def _check_gone(self) -> None:
        watched = set(self.owners.values())
        for others in self.remote.values():
            watched.update(others)
        if not watched:
            self._absent.clear()
            return
        b = self.broker
        try:
            live = set(await b.client.api.get_consumer_id_list(b.addr,
                                                               b.routes.config.group))
        except MQBrokerError:
            return  # no member answered: judge nobody on that
        now = trio.current_time()
        for gateway in list(self._absent):
            if gateway in live or gateway not in watched:
                del self._absent[gateway]
        for gateway in watched - live:
            since = self._absent.setdefault(gateway, now)
            if now - since >= self.gone_s:
                del self._absent[gateway]
                await self._gone(gateway)

    async def _gone(self, gateway: str) -> None:
        """`gateway` left the cluster: forget its consumers, delete its exclusive queues
        and the auto-delete queues it was the last to consume."""
        self.reaped.append(gateway)
        doomed: list[Key] = [k for k, owner in self.owners.items() if owner == gateway]
        for key, others in list(self.remote.items()):
            if others.pop(gateway, None) is not None and not others:
                del self.remote[key]
                doomed.append(key)
        log.info("AMQP gateway %s left the cluster: its consumers no longer count (%d "
                 "queue(s) to look at)", gateway, len(doomed))
        for vhost, name in doomed:
            b = self.broker.for_vhost(vhost)
            queue = b.queues.get(name)
            if queue is None:
                continue
            foreign = queue.exclusive and queue.owner is None
            if foreign or (queue.auto_delete and not self.count(b, queue)):
                await self.delete_once(b, queue)

    async def delete_once(self, broker: AmqpBroker, queue: Queue) -> bool:
        """Delete `queue` unless another gateway is deleting it (the deletion lock)."""
        locks = broker.expiry.locks
        mq = locks.mq(queue.lmq, DELETE_LOCK)
        try:
            if mq not in await locks.lock([mq]):
                return False
        except _ERRORS as exc:
            log.warning("AMQP deletion of queue %r not locked: %r", queue.name, exc)
            return False
        try:
            if broker.queues.get(queue.name) is queue:
                await broker._drop_queue(queue)
        finally:
            with contextlib.suppress(*_ERRORS):  # else it lapses on the broker
                await locks.unlock([mq])
        return True
