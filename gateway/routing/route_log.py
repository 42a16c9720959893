"""The shared routing table's trio driver: route log, snapshots and acknowledgements on
system topics, with standard RocketMQ requests only (docs/stateless-gateways.md).

* ``LMQ_GW_ROUTE_LOG`` (one queue): route changes (`LogEntry`). The version of an entry is
  its queue offset + 1, assigned by the broker, so every writer's changes are ordered.
* ``LMQ_GW_ROUTE_SNAP`` (one queue): table snapshots, in numbered parts; a gateway starts
  from the newest complete one and reads the log after it.
* ``LMQ_GW_ROUTE_ACK`` (one queue): ``{gateway, version}`` records, sent after a pull
  applied entries of other gateways (never while nothing changes). `AckTracker` (sans-IO)
  keeps the versions they applied.
* Liveness: every gateway is a member of the consumer group `group` on the route log's
  broker (HEART_BEAT every `heartbeat_interval_s`, kept in the broker's memory, nothing
  stored); the broker drops a member when its connection closes or after its channel
  expiry (120 s). GET_CONSUMER_LIST_BY_GROUP gives the live gateways.

`RouteLog.add_route` appends an entry and returns once every live gateway reported that
version, or after `ack_timeout_s`. Requests used: UPDATE_AND_CREATE_TOPIC, SEND_MESSAGE_V2,
PULL_MESSAGE (long polling), GET_MAX_OFFSET / GET_MIN_OFFSET, HEART_BEAT,
GET_CONSUMER_LIST_BY_GROUP: all in Apache RocketMQ 5.

Sweep: routes of clean sessions (owner `c:<gateway id>:...`) of a gateway that has not
been a member for `orphan_timeout_s` are removed by the live gateway with the smallest id
(checked every `sweep_interval_s`), so a gateway that never comes back leaves nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from core.client import ClientInstance, MessageQueue, PullStatus
from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.errors import RemotingError
from gateway.routing.master_follow import MasterFollower
from gateway.routing.route_table import LogEntry, Route, RouteError, RouteTable

__all__ = ["AckTracker", "RouteLog", "RouteLogConfig"]

log = logging.getLogger(__name__)


@dataclass
class RouteLogConfig:
    """Settings of the route log (defaults documented in docs/stateless-gateways.md)."""

    log_topic: str = "LMQ_GW_ROUTE_LOG"
    snap_topic: str = "LMQ_GW_ROUTE_SNAP"
    ack_topic: str = "LMQ_GW_ROUTE_ACK"
    group: str = "LMQ_GW_ROUTES"
    heartbeat_interval_s: float = 20.0  # HEART_BEAT (group membership; nothing stored)
    gateway_timeout_s: float = 5.0  # AckTracker's own liveness (not used by RouteLog)
    membership_ttl_s: float = 1.0  # a wait re-reads the member list when older than this
    membership_recheck_s: float = 0.25  # ... and this often while a member lags
    ack_timeout_s: float = 3.0
    pull_suspend_ms: int = 1000
    pull_batch: int = 32
    snapshot_every: int = 10_000
    snapshot_part_routes: int = 5_000  # routes per snapshot message (well under 4 MiB)
    max_routes: int = 1_000_000
    retry_delay_s: float = 0.5  # after a failed pull or send
    #: a gateway out of the group this long has vanished: its clean sessions' routes go
    orphan_timeout_s: float = 300.0
    sweep_interval_s: float = 30.0  # how often the gateways look for vanished ones


class AckTracker:
    """Which gateways are live and which table version each applied (sans-IO).

    A gateway is live while its last report is younger than `timeout_s` (measured on the
    local clock when the report was read, so peers' clocks do not matter).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._seen: dict[str, tuple[int, float]] = {}

    def record(self, gateway: str, version: int, now: float) -> None:
        old = self._seen.get(gateway)
        self._seen[gateway] = (max(version, old[0]) if old else version, now)

    def live(self, now: float) -> dict[str, int]:
        """gateway -> applied version, for live gateways; forgets the silent ones."""
        for g in [g for g, (_, t) in self._seen.items() if now - t > self.timeout_s]:
            del self._seen[g]
        return {g: v for g, (v, _) in self._seen.items()}

    def lagging(self, version: int, now: float) -> list[str]:
        """Live gateways that have not applied `version` yet."""
        return [g for g, v in self.live(now).items() if v < version]

    def version(self, gateway: str) -> int:
        """The last version `gateway` reported (0: none seen), however old the report."""
        seen = self._seen.get(gateway)
        return seen[0] if seen else 0

    def keep_only(self, gateways: set[str]) -> None:
        """Forget the reports of every gateway not in `gateways` (those that left)."""
        for g in [g for g in self._seen if g not in gateways]:
            del self._seen[g]


class RouteLog:
    """One gateway's copy of the routing table, kept in step with the cluster."""

    def __init__(self, client: ClientInstance, broker_addr: str, broker_name: str,
                 gateway_id: str, config: RouteLogConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.broker_name = broker_name
        self.gateway_id = gateway_id
        self.config = config or RouteLogConfig()
        #: the master of `broker_name`, followed across a failover (re-read on a failure)
        self.master = MasterFollower(client, broker_name, broker_addr,
                                     min_interval_s=self.config.retry_delay_s,
                                     on_change=self._moved)
        self._rejoin = trio.Event()
        self.table = RouteTable(max_routes=self.config.max_routes)
        # Reports are sent only on change: liveness comes from the group membership.
        self.acks = AckTracker(math.inf)
        #: gateways in the consumer group (live), as last read; and when (local clock)
        self.members: set[str] = set()
        self._members_at = -math.inf
        self.clock = clock
        self.snapshot_version = 0  # version of the snapshot this table was loaded from
        self._changed = trio.Event()  # set (and replaced) on every applied batch / ack read
        self._log_offset = 0
        self._ack_offset = 0
        self._last_snapshot = 0
        # Changes of this gateway, appended in the order they were asked for (a session's
        # remove must not overtake the add of its next subscription): (entry, done, out)
        self._outbox: list[tuple[LogEntry, trio.Event | None, list[int]]] = []
        self._outbox_work = trio.Event()
        #: gateways owning clean-session routes, not members: since when (local clock)
        self._absent: dict[str, float] = {}
        #: more gateway ids whose absence is timed (owners of persistent sessions' records)
        self.watch_gateways: set[str] = set()
        #: run after each sweep round (`await hook()`): other sweeps of abandoned state
        self.sweepers: list[Callable[[], Awaitable[object]]] = []

    # ------------------------------------------------------------------ broker I/O
    @property
    def addr(self) -> str:
        return self.master.addr

    @addr.setter
    def addr(self, value: str) -> None:
        self.master.addr = value

    def _moved(self, old: str, new: str) -> None:
        # The new master has not seen this gateway's HEART_BEAT: join there at once, or
        # the others would stop waiting for this gateway until the next heartbeat.
        self._rejoin.set()

    async def _failed(self, what: str, exc: BaseException) -> None:
        """A request to the route log's broker failed: log it, look for a new master
        (failover), then pause `retry_delay_s` unless the master moved."""
        log.warning("%s failed: %s", what, exc)
        if not await self.master.reresolve():
            await trio.sleep(self.config.retry_delay_s)

    def _mq(self, topic: str) -> MessageQueue:
        return MessageQueue(topic, self.broker_name, 0)

    async def _send(self, topic: str, body: bytes) -> int:
        """Append `body` to queue 0 of `topic`; its queue offset."""
        ext = {"a": self.config.group, "b": topic, "c": "TBW102", "d": "1", "e": "0",
               "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0",
               "k": "false", "m": "false"}
        result = await self.client.api.send_message(
            self.addr, self._mq(topic), ext, body, batch=False, uniq_id="")
        assert result is not None
        return result.queue_offset

    async def _pull(self, topic: str, offset: int, suspend_ms: int, max_nums: int | None = None):
        flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
        ext = {"consumerGroup": self.config.group, "topic": topic, "queueId": "0",
               "queueOffset": str(offset), "maxMsgNums": str(max_nums or self.config.pull_batch),
               "sysFlag": str(int(flag)), "commitOffset": "0",
               "suspendTimeoutMillis": str(suspend_ms), "subscription": "*",
               "subVersion": "0", "expressionType": "TAG"}
        timeout = suspend_ms / 1000.0 + self.client.config.request_timeout
        return await self.client.api.pull_message(self.addr, ext, timeout)

    async def ensure_topics(self) -> None:
        for topic in (self.config.log_topic, self.config.snap_topic, self.config.ack_topic):
            await self.client.api.create_topic(self.addr, topic, 1, 1)

    # ------------------------------------------------------------------ start-up
    async def load(self) -> None:
        """Newest complete snapshot, then the log after it, up to its current end."""
        cfg = self.config
        await self.ensure_topics()
        start = await self._load_snapshot()
        if start is None:
            start = await self.client.api.get_min_offset(self.addr, cfg.log_topic, 0)
        self._log_offset = start
        while await self._apply_log(0):
            pass
        self._ack_offset = await self.client.api.get_max_offset(self.addr, cfg.ack_topic, 0)

    async def _load_snapshot(self) -> int | None:
        """Load the newest complete snapshot; the log offset to read from, or None (no
        usable snapshot: read the whole log)."""
        try:
            return await self._read_snapshot()
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("route snapshot unusable, reading the whole log: %s", exc)
            return None

    async def _read_snapshot(self) -> int | None:
        topic = self.config.snap_topic
        end = await self.client.api.get_max_offset(self.addr, topic, 0)
        low = await self.client.api.get_min_offset(self.addr, topic, 0)
        if end <= low:
            return None
        last = await self._pull(topic, end - 1, 0, 1)
        if last.status is not PullStatus.FOUND or not last.messages:
            return None
        head = json.loads(last.messages[0].body)
        version, parts = int(head["v"]), int(head["n"])
        first = end - parts
        if parts < 1 or first < low:
            return None
        routes: list[dict] = []
        offset = first
        while offset < end:
            got = await self._pull(topic, offset, 0, min(self.config.pull_batch, end - offset))
            if got.status is not PullStatus.FOUND:
                return None
            for msg in got.messages:
                part = json.loads(msg.body)
                if int(part["v"]) != version or int(part["n"]) != parts:
                    return None  # interleaved writers: fall back to the whole log
                routes.extend(part["r"])
            offset = got.next_begin_offset
        self.table.load(version, routes)
        self.snapshot_version = self._last_snapshot = version
        return version  # version = offset of the last covered entry + 1

    # ------------------------------------------------------------------ steady state
    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _apply_log(self, suspend_ms: int) -> bool:
        """One pull of the log; True if entries were applied (the table's version moved:
        entries this gateway appended itself were applied when they were stored)."""
        got = await self._pull(self.config.log_topic, self._log_offset, suspend_ms)
        if got.status is PullStatus.OFFSET_ILLEGAL:
            self._log_offset = max(got.next_begin_offset, got.min_offset)
            return True
        if got.status is not PullStatus.FOUND:
            return False
        before = self.table.version
        for msg in got.messages:
            version = msg.queue_offset + 1
            try:
                entry = LogEntry.decode(msg.body, version)
            except RouteError as exc:
                log.warning("route log entry %d skipped: %s", version, exc)
                self.table.version = max(self.table.version, version)
                continue
            self.table.apply(entry)
        self._log_offset = max(self._log_offset, got.next_begin_offset)
        if self.table.version == before:
            return False
        self._applied()
        return True

    def _applied(self) -> None:
        # This gateway's own version is known here: waiting for its own report to come
        # back through the ack topic would only add a round trip.
        self.acks.record(self.gateway_id, self.table.version, self.clock())
        self._notify()

    async def report(self) -> None:
        """Tell the others which version this gateway applied."""
        body = json.dumps({"g": self.gateway_id, "v": self.table.version}).encode()
        await self._send(self.config.ack_topic, body)

    async def _log_loop(self) -> None:
        while True:
            try:
                if await self._apply_log(self.config.pull_suspend_ms):
                    await self.report()
                await self._maybe_snapshot()
            except (MQClientError, RemotingError, OSError) as exc:
                await self._failed("route log pull", exc)

    async def _ack_loop(self) -> None:
        while True:
            try:
                got = await self._pull(self.config.ack_topic, self._ack_offset,
                                       self.config.pull_suspend_ms)
            except (MQClientError, RemotingError, OSError) as exc:
                await self._failed("route ack pull", exc)
                continue
            if got.status is PullStatus.FOUND:
                now = self.clock()
                for msg in got.messages:
                    try:
                        rec = json.loads(msg.body)
                        self.acks.record(str(rec["g"]), int(rec["v"]), now)
                    except (ValueError, KeyError, TypeError):
                        continue
                self._notify()
            if got.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                self._ack_offset = max(got.next_begin_offset, self._ack_offset)

    def _heartbeat_data(self) -> dict:
        return {"clientID": self.gateway_id, "producerDataSet": [], "consumerDataSet": [{
            "groupName": self.config.group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "BROADCASTING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "unitMode": False, "subscriptionDataSet": []}]}

    async def join(self) -> None:
        """Become a member of the gateways' consumer group (HEART_BEAT)."""
        await self.client.api.heartbeat(self.addr, self._heartbeat_data())

    async def _heartbeat_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.heartbeat_interval_s):
                await self._rejoin.wait()
            self._rejoin = trio.Event()
            try:
                # A master that changed without failing a request (a demoted one still
                # answers reads) is found here, once per heartbeat.
                await self.master.reresolve()
                await self.join()
            except (MQClientError, RemotingError, OSError) as exc:
                log.warning("route log heartbeat failed: %s", exc)
                await self.master.reresolve()

    async def refresh_members(self) -> None:
        """Read the live gateways (GET_CONSUMER_LIST_BY_GROUP); on failure keep the last."""
        try:
            ids = await self.client.api.get_consumer_id_list(self.addr, self.config.group)
        except (MQClientError, RemotingError, OSError) as exc:
            log.warning("reading the live gateways failed: %s", exc)
            return
        self.members = set(ids)
        self._members_at = self.clock()
        self.acks.keep_only(self.members | {self.gateway_id})

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Load the table, join the group, then follow the log and the acknowledgements
        until cancelled."""
        await self.load()
        try:
            await self.join()
        except (MQClientError, RemotingError, OSError) as exc:
            # Not a member: the others do not wait for this gateway (bounded staleness)
            # until a heartbeat gets through.
            log.warning("route log: joining the gateways' group failed: %s", exc)
        await self.refresh_members()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._log_loop)
            nursery.start_soon(self._ack_loop)
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self._outbox_loop)
            nursery.start_soon(self._sweep_loop)
            task_status.started()

    async def _sweep_loop(self) -> None:
        while True:
            await trio.sleep(self.config.sweep_interval_s)
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - a failed round must not stop the gateway
                log.exception("sweep of abandoned routes failed; retried next round")

    async def sweep(self) -> int:
        """Remove the clean-session routes of gateways that have been out of the group
        for `orphan_timeout_s`, if this is the live gateway with the smallest id (one
        sweeper, the same on all). Returns the number of removes posted."""
        read_at = self._members_at
        await self.refresh_members()
        if self._members_at == read_at:
            return 0  # the member list could not be read: judge nobody on old news
        now = self.clock()
        live = self.members | {self.gateway_id}
        owners = set(self.table.clean_gateways()) | self.watch_gateways
        for gw in list(self._absent):
            if gw in live or gw not in owners:
                del self._absent[gw]
        for gw in owners - live:
            self._absent.setdefault(gw, now)
        for hook in self.sweepers:
            try:
                await hook()
            except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
                log.warning("sweep of abandoned state failed: %r", exc)
        if not self.is_sweeper():
            return 0
        posted = 0
        for gw, since in list(self._absent.items()):
            if now - since < self.config.orphan_timeout_s:
                continue
            routes = self.table.clean_routes(gw)
            if not routes:
                continue
            for route in routes:
                self.post("remove", route)
            posted += len(routes)
            log.info("route log: gateway %s vanished %.0f s ago; removing %d route(s) of "
                     "its clean sessions", gw, now - since, len(routes))
        return posted

    def absent_for(self, gateway: str) -> float | None:
        """Seconds since the last sweep first found `gateway` out of the group (None:
        live, or not watched)."""
        since = self._absent.get(gateway)
        return None if since is None else self.clock() - since

    def is_sweeper(self, prefix: str = "") -> bool:
        """Is this the live gateway with the smallest id (among ids with `prefix`)?"""
        # Members that only write LMQs ("writer-...", the Spark sink) run no sweep.
        ids = [g for g in self.members | {self.gateway_id}
               if g.startswith(prefix) and not g.startswith("writer-")]
        return bool(ids) and min(ids) == self.gateway_id

    def live_gateways(self) -> dict[str, int]:
        """Live gateways (group members as last read, and this one) -> applied version."""
        return {g: (self.table.version if g == self.gateway_id else self.acks.version(g))
                for g in self.members | {self.gateway_id}}

    def lagging(self, version: int, prefix: str = "") -> list[str]:
        """Live gateways (ids starting with `prefix`), other than this one, that have not
        reported `version` yet."""
        return [g for g in self.members if g != self.gateway_id and g.startswith(prefix)
                and self.acks.version(g) < version]

    async def changed(self) -> None:
        """Return at the next applied batch or acknowledgement read."""
        await self._changed.wait()

    # ------------------------------------------------------------------ changes
    async def add_route(self, route: Route, *, wait_for: str = "") -> tuple[int, bool]:
        """Append an add; (version, True) once every live gateway whose id starts with
        `wait_for` (all by default) applied it, or (version, False) after
        `ack_timeout_s`. (An MQTT route matters only to the gateways that route MQTT
        publishes: the MQTT gateway waits for `mqtt-` gateways only.)"""
        return await self._change(LogEntry("add", route), wait_for)

    async def remove_route(self, route: Route, *, wait_for: str = "") -> tuple[int, bool]:
        return await self._change(LogEntry("remove", route), wait_for)

    async def _change(self, entry: LogEntry, wait_for: str = "") -> tuple[int, bool]:
        done = trio.Event()
        out: list[int] = []
        self._outbox.append((entry, done, out))
        self._outbox_work.set()
        await done.wait()
        if not out:
            raise MQClientError(f"route change not stored: {entry.op} {entry.route}")
        version = out[0]
        return version, await self.wait_applied(version, wait_for)

    def post(self, op: str, route: Route) -> None:
        """Queue a change without waiting for it (sync callers: a session that ends);
        appended after every change asked for before, and retried until stored."""
        self._outbox.append((LogEntry(op, route), None, []))
        self._outbox_work.set()

    async def _outbox_loop(self) -> None:
        while True:
            await self._outbox_work.wait()
            self._outbox_work = trio.Event()
            while self._outbox:
                entry, done, out = self._outbox[0]
                try:
                    version = await self._send(self.config.log_topic, entry.encode()) + 1
                except (MQClientError, RemotingError, OSError) as exc:
                    if done is not None and await self.master.reresolve():
                        continue  # the master moved (failover): send it there
                    if done is not None:
                        self._outbox.pop(0)
                        done.set()  # the caller sees the failure (no version)
                        continue
                    await self._failed(f"storing route change {entry.op}", exc)
                    continue
                self._outbox.pop(0)
                self._apply_own(LogEntry(entry.op, entry.route, version))
                out.append(version)
                if done is not None:
                    done.set()

    def _apply_own(self, entry: LogEntry) -> None:
        """Apply an entry this gateway just appended when it is the next one in the log
        (every earlier entry is applied): no need to wait for the log pull to bring it."""
        if self.table.version == entry.version - 1:
            self.table.apply(entry)
            self._log_offset = max(self._log_offset, entry.version)
            self._applied()

    async def wait_applied(self, version: int, prefix: str = "") -> bool:
        """Wait until this gateway and every live one applied `version` (bounded). The
        member list is re-read when older than `membership_ttl_s`, and every
        `membership_recheck_s` while a member lags (a gateway that died drops out)."""
        cfg = self.config
        with trio.move_on_after(cfg.ack_timeout_s):
            if self.clock() - self._members_at > cfg.membership_ttl_s:
                await self.refresh_members()
            while self.table.version < version or self.lagging(version, prefix):
                with trio.move_on_after(cfg.membership_recheck_s):
                    await self._changed.wait()
                    continue
                if self.lagging(version, prefix):
                    await self.refresh_members()
            return True
        return False

    # ------------------------------------------------------------------ snapshots
    async def _maybe_snapshot(self) -> None:
        if self.table.version - self._last_snapshot < self.config.snapshot_every:
            return
        live = self.live_gateways()
        if live and min(live) != self.gateway_id:
            return  # the gateway with the smallest id writes snapshots
        await self.write_snapshot()

    async def write_snapshot(self) -> int:
        """Write the table as it is now; the version it covers."""
        version, routes = self.table.snapshot()
        size = self.config.snapshot_part_routes
        parts = max(1, math.ceil(len(routes) / size))
        for i in range(parts):
            body = json.dumps({"v": version, "n": parts, "i": i,
                               "r": routes[i * size:(i + 1) * size]}, separators=(",", ":"))
            await self._send(self.config.snap_topic, body.encode())
        self._last_snapshot = version
        return version
