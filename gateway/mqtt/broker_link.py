"""The gateway's only road to the brokers: publish (stored once + LMQ multi-dispatch) and
LMQ pulls, through `core.client` (in-process transport when embedded, TCP otherwise).

Publishing. Every connection hands its publishes to one `BrokerLink` queue; one
dispatcher task takes whatever has accumulated, computes each message's LMQ set from the
live-filter router, groups the messages by store queue (queue = crc32(MQTT topic) mod
queue count, so per-topic order holds) and sends one SEND_BATCH_MESSAGE per group. While a
round is on the wire the next one accumulates, so batches grow with load and a lone
message goes out at once. Completion callbacks run in arrival order (PUBACKs go out in the
order the PUBLISHes came, MQTT-4.6.0-2/-3).

LMQ state. `LmqState` per (broker, LMQ) is what lets sessions read LMQs without
long-polling each of them: the dispatcher counts writes in progress (`pending`) and bumps
`version` when one completes, waking the sessions that read the LMQ; `recent` keeps the
last entries read (offset -> message; LMQ entries never change), so N sessions on one
filter cost one pull, not N. Predicting tails is exact only while this gateway is the only
writer of its `%LMQ%m_...` queues. With other gateways (`share_lmqs()`: always for `lmq
mqtt`, and for `lmq serve` once another MQTT gateway shows up in the route log) tails are
not predicted, and one long-polling PULL per read LMQ (lmq_watch.py) brings what any
gateway wrote to it into the recent entries, reads ahead of readers behind and wakes them
(docs/stateless-gateways.md).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Collection
from itertools import chain, groupby
from operator import attrgetter
from typing import Any, Protocol

import trio

from core.client import ClientInstance, MessageQueue
from core.client.errors import MQClientError
from core.remoting.codes import ResponseCode
from core.remoting.errors import RemotingError
from core.remoting.local import caller_yields
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.flow import DeliveryGate
from gateway.mqtt.link_cluster import (  # noqa: F401 - re-exported (tests, callers)
    CLUSTER_REFRESH_S,
    CLUSTER_WAIT_S,
    ERROR_REFRESH_S,
    NO_MASTER_LOG_INTERVAL_S,
    LinkCluster,
)
from gateway.mqtt.link_reads import DECODED_CACHE, DECODED_CACHE_BYTES, LinkReads
from gateway.mqtt.lmq_state import LmqState, MessageCache, RecentBudget
from gateway.mqtt.message import MqttMessage
from gateway.mqtt.store_request import StoredProperties, local_header, offset_ids, request_ext
from gateway.routing.bridge import AMQP_LMQ_PREFIXES, register_link

__all__ = ["AckSink", "BrokerLink", "LmqState", "PublishDone", "SEND_FAILED", "QUOTA_EXCEEDED"]

log = logging.getLogger(__name__)

#: Reason codes handed to publish callbacks (v5 PUBACK codes).
STORED = 0x00
NO_MATCHING_SUBSCRIBERS = 0x10
SEND_FAILED = 0x80
QUOTA_EXCEEDED = 0x97

#: A round's batch per store queue is cut at this many bytes (broker max is 4 MiB).
MAX_BATCH_BYTES = 1024 * 1024
#: PUBLISHes a reader submits before it lets other tasks run (one socket read can hold
#: hundreds: PINGREQs and deliveries run between slices of it).
PUBLISHES_PER_STEP = 64
#: `submit`'s advice to the publisher's reader: carry on, let other tasks run, or wait
#: for room (wait_for_space).
GO_ON, STEP, FULL = 0, 1, 2
#: A reader stores its read's publishes itself (`store_held`) only when no round ended
#: within this many seconds: lone publishes (up to about 2,000 a second) skip the hop to
#: the dispatcher; busier traffic (many devices, floods) is batched by the dispatcher, one
#: store request for what accumulated during a pass of the scheduler.
READER_ROUND_GAP_S = 0.0005
SEND_TIMEOUT_S = 5.0
#: Attempts per batch, counting only failures where nothing can have been stored (no
#: connection, or the broker answered with an error); an unknown outcome is not retried.
SEND_ATTEMPTS = 2

PublishDone = Callable[[int], None]
_STATES = attrgetter("states")


class AckSink(Protocol):
    """Takes the answers of its publishes in one call per round (`submit` with a packet
    id): a connection acknowledging a run of QoS 1 PUBLISHes writes one run of PUBACKs
    and wakes its writer once, instead of a callback per message."""

    def stored_run(self, acks: list[int]) -> None:
        """[packet id, reason code, packet id, reason code, ...] in submission order."""


#: Every retained publish is also indexed here, so that every gateway learns it
#: (retained.py: RetainedFollower); the message is still stored once.
RETAINED_LMQ = "%LMQ%mqtt_retained"


class _Request:
    __slots__ = ("msg", "done", "pid", "code", "lmqs", "routed", "states")

    def __init__(self, msg: MqttMessage, done: PublishDone | AckSink | None,
                 pid: int = -1) -> None:
        self.msg = msg
        self.done = done
        self.pid = pid  # >= 0: `done` is an AckSink, answered with this packet id
        self.code = SEND_FAILED  # the store's answer, once there is one
        self.lmqs: tuple[str, ...] | list[str] = []
        self.routed = False  # some subscription matched (v5 PUBACK 0x10 otherwise)
        self.states: tuple[LmqState, ...] = ()  # of the LMQs read when it was routed


class BrokerLink(LinkReads, LinkCluster):
    """Publishes and pulls for one gateway; run `run()` in the gateway's nursery."""

    def __init__(
        self,
        client: ClientInstance,
        config: MqttConfig,
        router: Callable[[str], Collection[str]],
        on_stored: Callable[[MqttMessage], None] | None = None,
    ) -> None:
        """`on_stored(msg)` runs for each stored retained message, before its publisher
        is answered."""
        self.client = client
        self.config = config
        self.router = router
        self.on_stored = on_stored
        #: called with the names of brokers that joined after start (sessions read there too)
        self.on_brokers_added: Callable[[list[str]], None] | None = None
        #: (broker name, queue id) of every store queue, in a stable order
        self.queues: list[tuple[str, int]] = []
        self.brokers: dict[str, str] = {}
        self.states: dict[tuple[str, str], LmqState] = {}
        self._decoded = MessageCache(DECODED_CACHE, DECODED_CACHE_BYTES)
        #: payload bytes in every LMQ's recent entries, bounded by max_recent_bytes
        self.recent_budget = RecentBudget(config.max_recent_bytes)
        #: payload bytes of the publishes in the queue (bounded by max_pending_bytes)
        self.backlog_bytes = 0
        self._queue: list[_Request] = []
        self._work = trio.Event()
        # Retained publishes submitted but not yet answered by the broker: a SUBSCRIBE
        # waits for them before reading the retained table (see retained_settled).
        self.retained_inflight = 0
        self._retained_settled: trio.Event | None = None
        self._space = trio.Event()
        self._in_round = False
        #: a reader is submitting a read's publishes: the dispatcher is not woken for
        #: them, the reader stores them itself if it is idle (`hold`, `store_held`)
        self._held = False
        self._round_end = -1.0  # trio time the last round ended
        self._sending = 0  # sends on the wire
        #: per broker, the highest commitlog offset whose LMQ entries are all accounted
        #: for in the known tails (sends are sequential: everything below it is, too)
        self.advanced: dict[str, int] = {}
        self._sent_chunks = 0  # sends answered (or failed) so far
        self._late: list[LmqState] = []
        #: topic_mismatch: LMQ entries skipped because their topic did not match the filter
        self.stats = {"stored": 0, "failed": 0, "rounds": 0, "topic_mismatch": 0, "pulls": 0}
        #: closed while a delivery task falls behind: publishing connections stop reading
        self.gate = DeliveryGate()
        #: publishes queued before readers pause: also bounds a round, so that one round
        #: cannot push readers out of the LMQs' recent entries (flow.py)
        self.dispatch_bound = min(config.max_pending_publishes, config.backpressure_lag)
        self._props = StoredProperties()
        #: The broker of this process, stored to without requests (`attach_local`).
        self.local_send: Any = None
        #: its address: used while it is the master the cluster names (`brokers`)
        self.local_addr: str | None = None
        #: when "no master broker" was last logged (None: not in such an episode), and
        #: how often it was seen since without being logged
        self._no_master_logged_at: float | None = None
        self._no_master_unlogged = 0
        self._error_refresh_at = -ERROR_REFRESH_S  # trio time of the last refresh on error
        #: other gateways may write our LMQs: no tail prediction, watch pulls instead
        self.foreign_writers = False
        #: LMQs watched (other gateways write them): their read-ahead (lmq_watch.py)
        self._watched: dict[tuple[str, str], Any] = {}
        self._nursery: trio.Nursery | None = None
        register_link(self)  # the amq.topic bridge may switch it (routing/bridge.py)

    # -- LMQ states ----------------------------------------------------------------------

    def state(self, broker: str, lmq: str) -> LmqState:
        key = (broker, lmq)
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = LmqState(broker, lmq, self.recent_budget)
            if self._in_round:
                # A write to it may be on the wire already, uncounted: treat it as
                # pending until the round ends (costs at most one extra pull).
                st.pending += 1
                self._late.append(st)
        return st

    def release(self, st: LmqState) -> None:
        """Forget a state nobody reads and nothing writes (keeps the table bounded).

        Only `st` itself: a cursor may still hold an older, already forgotten state of
        the same LMQ, and releasing that must not drop the live state that replaced it
        (its readers would no longer be woken nor get the predicted offsets: acknowledged
        messages were never delivered under subscribe churn, issue 9 §4)."""
        key = (st.broker, st.lmq)
        if not st.watchers and not st.pending and self.states.get(key) is st:
            del self.states[key]
            st.forget_recent()

    # -- publishing ----------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        return len(self._queue)

    @property
    def backlog_full(self) -> bool:
        return (len(self._queue) >= self.dispatch_bound
                or self.backlog_bytes >= self.config.max_pending_bytes)

    def submit(self, msg: MqttMessage, done: PublishDone | AckSink | None = None,
               pid: int = -1) -> int:
        """Queue `msg` for storage; `done(reason)` runs once the broker answered, or, with
        a packet id `pid`, `done` is an AckSink told (pid, reason) with the rest of its
        round's answers. Returns what a reader submitting a run should do next: GO_ON,
        STEP (let other tasks run) or FULL (`wait_for_space` first)."""
        if msg.retain:
            self.retained_inflight += 1
        queue = self._queue
        queue.append(_Request(msg, done, pid))
        self.backlog_bytes += len(msg.payload)
        n = len(queue)
        if n == 1 and not self._held:  # was empty (only the dispatcher takes it): wake it
            self._work.set()
        if n >= self.dispatch_bound or self.backlog_bytes >= self.config.max_pending_bytes:
            return FULL
        return GO_ON if n % PUBLISHES_PER_STEP else STEP

    def _retained_answered(self, req: _Request) -> None:
        if req.msg.retain:
            self.retained_inflight -= 1
            if not self.retained_inflight and self._retained_settled is not None:
                self._retained_settled.set()
                self._retained_settled = None

    async def retained_settled(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until every retained publish submitted so far was
        answered. A subscription added to the trie before this call gets later publishes
        live; one dispatched earlier but stored after the retained table was read would
        otherwise reach the new subscriber neither way."""
        with trio.move_on_after(timeout_s):
            while self.retained_inflight:
                if self._retained_settled is None:
                    self._retained_settled = trio.Event()
                await self._retained_settled.wait()

    # -- a reader's own round (docs/mqtt.md, "Latency round") ------------------------------

    @property
    def held(self) -> bool:
        return self._held

    def hold(self) -> None:
        """A reader starts submitting a read's publishes: do not wake the dispatcher for
        them. The reader calls `unhold` before it waits for anything, and `store_held`
        once the read is handled."""
        self._held = True

    def unhold(self) -> None:
        """End a hold without storing: the dispatcher takes what is queued."""
        self._held = False
        if self._queue:
            self._work.set()

    async def store_held(self, defer: list | None = None) -> None:
        """End a hold. When the dispatcher is idle (no round, no wake-up pending, none
        ended within READER_ROUND_GAP_S), store the queue in the calling task: a lone
        publish costs no hop to the dispatcher task. The round is shielded: a client that goes away meanwhile cannot cut a
        store request in two (stored, yet not answered and its readers not woken).
        `defer` (a list) collects the LMQ readers to wake instead of waking them, so the
        caller can deliver to them itself first (`Session.deliver_now`)."""
        self._held = False
        if not self._queue:
            return
        if self._in_round or self._work.is_set() \
                or trio.current_time() - self._round_end < READER_ROUND_GAP_S:
            self._work.set()  # busy: the dispatcher batches (after the round in progress)
            return
        batch, self._queue = self._queue, []
        nbytes, self.backlog_bytes = self.backlog_bytes, 0
        self._space.set()
        try:
            with trio.CancelScope(shield=True):
                await self._round(batch, nbytes, defer)
        finally:
            if self._queue:
                self._work.set()

    async def wait_for_space(self) -> None:
        """Back pressure: return once the queue is below `dispatch_bound` messages and
        `max_pending_bytes` payload bytes."""
        while self.backlog_full:
            if self._space.is_set():
                self._space = trio.Event()
            await self._space.wait()

    async def drain(self) -> None:
        """Return once every queued publish has been sent (shutdown)."""
        while self._queue or self._in_round:
            await trio.sleep(0.01)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # watch pulls
            task_status.started()
            await self._dispatch()

    async def _dispatch(self) -> None:
        # Every pass waits for work, which yields even when work is there (a set Event is
        # a checkpoint), and a round yields between its sends but not after its last: so
        # the store's answer to a lone publish is used, and its readers woken, with no
        # extra pass of the scheduler (the in-process transport does not yield for us,
        # core/remoting/local.py), and no round follows another without a yield between.
        caller_yields()
        while True:
            await self._work.wait()
            self._work = trio.Event()
            if self._queue and not self._in_round:  # (a reader's round wakes us after it)
                batch, self._queue = self._queue, []
                nbytes, self.backlog_bytes = self.backlog_bytes, 0
                self._space.set()
                await self._round(batch, nbytes)

    async def _round(self, batch: list[_Request], nbytes: int = -1,
                     defer: list | None = None) -> None:
        """Store `batch` (`nbytes` of payload, -1: not counted) and answer its requests;
        the readers of the LMQs written are woken, or added to `defer`."""
        self.stats["rounds"] += 1
        queues = self.queues
        nq = len(queues)
        if not nq:
            # No broker known (not started, or none ever registered): fail the round
            # rather than divide by zero; publishers get SEND_FAILED (v5 0x80).
            self._fail(batch, "no broker is known")
            return
        groups: dict[tuple[str, int], list[_Request]] = {}
        # Messages written to each read LMQ this round (its pending count, one wake-up).
        touched: dict[LmqState, int] = {}
        # Publishers repeat their topics: the route of a (topic, retain) once per round.
        routes: dict[tuple[str, bool], tuple] = {}
        # A socket read is one publisher's, which repeats its topic: a run of requests of
        # one route takes it (and is counted) once.
        route: tuple = ((), (), False, ())
        topic = retain = None
        run = 0
        for req in batch:
            msg = req.msg
            if msg.topic is not topic or msg.retain != retain:
                for st in route[3]:
                    touched[st] = touched.get(st, 0) + run
                topic, retain, run = msg.topic, msg.retain, 0
                route = routes.get((topic, retain))
                if route is None:
                    route = routes[(topic, retain)] = self._route(topic, retain, queues, groups)
            group, req.lmqs, req.routed, req.states = route
            group.append(req)
            run += 1
        for st in route[3]:
            touched[st] = touched.get(st, 0) + run
        for st, n in touched.items():
            st.pending += n
        self._in_round = True
        try:
            last_group = len(groups) - 1
            # Groups are cut at MAX_BATCH_BYTES (payloads and 256 bytes each for the rest),
            # which the round's total usually shows is not needed.
            whole = 0 <= nbytes and nbytes + 256 * len(batch) < MAX_BATCH_BYTES
            for g, ((broker, qid), reqs) in enumerate(groups.items()):
                start = 0
                while start < len(reqs):
                    end, size = start, 0
                    if whole:
                        end = len(reqs)
                    while end < len(reqs) and (end == start or size < MAX_BATCH_BYTES):
                        size += len(reqs[end].msg.payload) + 256
                        end += 1
                    chunk = reqs[start:end] if start or end < len(reqs) else reqs
                    self._sending += 1
                    try:
                        code = await self._send(broker, qid, chunk)
                    finally:
                        self._sending -= 1
                        self._sent_chunks += 1
                    for req in chunk:
                        req.code = code
                    self._advance_tails(broker, chunk, code == STORED)
                    start = end
                    if start < len(reqs) or g < last_group:
                        # A round is long: let others run between its sends. Not after
                        # its last (a lone message's only) send: the readers are woken
                        # below at once, not after one more pass of the scheduler.
                        await trio.lowlevel.checkpoint()
        finally:
            self._in_round = False
            self._round_end = trio.current_time()
            late, self._late = self._late, []
            for st, n in [*touched.items(), *((st, 1) for st in late)]:
                st.completed(n, defer)
                if not st.watchers and not st.pending:
                    self.release(st)
        self._answer(batch)

    def _answer(self, batch: list[_Request]) -> None:
        """Answer a round's requests (their `code`), in arrival order (PUBACKs go out in
        the order the PUBLISHes came, MQTT-4.6.0-2/-3); an AckSink once, after the rest."""
        on_stored = self.on_stored
        stored = 0
        sinks: dict[AckSink, list[int]] | None = None
        for req in batch:
            code = req.code
            msg = req.msg
            if code == STORED:
                stored += 1
                if msg.retain and on_stored is not None:
                    try:
                        on_stored(msg)  # retained: written before the PUBACK below
                    except Exception:
                        log.exception("handling a stored message failed")
                if not req.routed:
                    code = NO_MATCHING_SUBSCRIBERS
            if msg.retain:
                self._retained_answered(req)
            done = req.done
            if done is None:
                continue
            if req.pid >= 0:
                if sinks is None:
                    sinks = {}
                acks = sinks.get(done)
                if acks is None:
                    sinks[done] = [req.pid, code]
                else:
                    acks.append(req.pid)
                    acks.append(code)
                continue
            try:
                done(code)
            except Exception:
                log.exception("publish callback failed")
        self.stats["stored"] += stored
        self.stats["failed"] += len(batch) - stored
        if sinks is not None:
            for sink, acks in sinks.items():
                try:
                    sink.stored_run(acks)
                except Exception:
                    log.exception("publish callback failed")

    def _route(self, topic: str, retain: bool, queues: list, groups: dict) -> tuple:
        """(the request list of its store queue in `groups`, LMQs sorted, routed, the read
        LMQs' states) of a publish on `topic`."""
        nq = len(queues)
        lmqs = self.router(topic)
        crc = zlib.crc32(topic.encode("utf-8"))
        broker, qid = queues[crc % nq]
        routed = bool(lmqs)
        if lmqs and nq > self.config.store_queues and \
                any(lmq.startswith(AMQP_LMQ_PREFIXES) for lmq in lmqs):
            # Several brokers, and it reaches AMQP queues (amq.topic): stored where
            # the AMQP gateways pop them, the first master by name.
            broker, qid = queues[crc % self.config.store_queues]
        if retain:
            lmqs = (*lmqs, RETAINED_LMQ)
        lmqs = (lmqs if type(lmqs) is tuple else tuple(sorted(lmqs))) if lmqs else ()
        states = self.states
        # only LMQs someone reads need the count (and their tails)
        read = tuple(st for st in (states.get((broker, lmq)) for lmq in lmqs) if st is not None)
        group = groups.get((broker, qid))
        if group is None:
            group = groups[(broker, qid)] = []
        return group, lmqs, routed, read

    def _fail(self, batch: list[_Request], why: str) -> None:
        """Answer every request of a round that could not be sent at all."""
        log.warning("%d MQTT message(s) not stored: %s", len(batch), why)
        for req in batch:
            req.code = SEND_FAILED
        self._answer(batch)

    def _advance_tails(self, broker: str, chunk: list[_Request], stored: bool) -> None:
        """Give each stored message its offset in every read LMQ whose tail is known."""
        if stored:
            last = chunk[-1].msg.commitlog_offset
            if last > self.advanced.get(broker, -1):
                self.advanced[broker] = last
        # (States created since the round began are pending until it ends: their tails
        # are not known yet, so the states found when it began are all there is to do.)
        # _send gives every message of a chunk its commitlog offset, or none.
        known = stored and chunk[0].msg.commitlog_offset >= 0 \
            and chunk[-1].msg.commitlog_offset >= 0
        # An LMQ's runs of messages (a run's list is shared by its states: not copied
        # unless the LMQ has several runs)
        runs: dict[LmqState, list[list[MqttMessage]]] = {}
        # Requests of one route share their states: a run of them is handled at once.
        for states, reqs in groupby(chunk, _STATES):
            msgs = None
            for st in states:
                if st.tail is None:
                    continue
                if not known:
                    st.tail = None  # unknown outcome: readers pull to find out
                    continue
                if msgs is None:
                    msgs = [req.msg for req in reqs]
                got = runs.get(st)
                if got is None:
                    runs[st] = [msgs]
                else:
                    got.append(msgs)
        for st, lists in runs.items():
            msgs = lists[0] if len(lists) == 1 else [*chain.from_iterable(lists)]
            first = st.tail
            st.tail = st.top = first + len(msgs)
            st.remember_run(first, msgs)

    async def _send(self, broker: str, qid: int, reqs: list[_Request]) -> int:
        props, body, batch = self._props.request(reqs)
        born = int(time.time() * 1000)
        local = self.local_send
        if local is not None and self.brokers.get(broker) != self.local_addr:
            local = None  # not (or no longer) the master of this process
        if local is not None:
            # The broker of this process (`attach_local`): no request (store-api.md).
            header = local_header(self.config, qid, props, batch, born)
        else:
            ext = request_ext(self.config, qid, props, batch, born)
            mq = MessageQueue(self.config.store_topic, broker, qid)
        err: Exception | None = None
        for _attempt in range(SEND_ATTEMPTS):
            try:
                if local is not None:
                    ids = ",".join((await local.send(header, body)).result.msg_ids)
                else:
                    try:
                        addr = self.addr(broker)
                        # Connect apart from the request: a failure here has certainly
                        # sent nothing.
                        await self.client.api.remoting.connection(addr)
                    except (MQClientError, RemotingError) as exc:
                        err = exc
                        await self._refresh_after_error()
                        continue
                    result = await self.client.api.send_message(
                        addr, mq, ext, body, batch=batch, uniq_id="", timeout=SEND_TIMEOUT_S)
                    ids = result.offset_msg_id if result is not None else None
            except MQClientError as exc:
                # The broker answered with an error (MQBrokerError), or the client refused
                # the request locally: nothing was stored, sending again is safe.
                err = exc
                if exc.code == ResponseCode.MESSAGE_ILLEGAL:
                    break  # retrying won't help
                continue
            except Exception as exc:
                # A timeout or a connection lost with the request sent: the broker may
                # have stored it. Sending again could store it twice (a QoS 2 message
                # delivered twice, LMQ tails off by one): fail it, the caller forgets the
                # predicted tails and readers pull to see what is there.
                log.warning("store of %d MQTT message(s) on %s has an unknown outcome: %r",
                            len(reqs), broker, exc)
                await self._refresh_after_error()
                return SEND_FAILED
            # Offset msgId = store host + 8-byte commitlog offset (hex), one per message.
            offsets = offset_ids(ids, len(reqs)) if ids is not None else None
            if offsets is not None:
                for req, offset in zip(reqs, offsets, strict=True):
                    msg = req.msg
                    msg.broker = broker
                    msg.commitlog_offset = offset
            return STORED
        log.warning("store of %d MQTT message(s) on %s failed: %r", len(reqs), broker, err)
        illegal = getattr(err, "code", None) == ResponseCode.MESSAGE_ILLEGAL
        return QUOTA_EXCEEDED if illegal else SEND_FAILED

    def attach_local(self, core_broker: Any) -> None:
        """Store through `core_broker`'s send checks and put directly (LocalSend) while
        it is the master of its broker name: it runs in this process (`lmq serve`).
        Without it (or with a broker in
        apache_strict mode) every store is a SEND request. The gateway's account
        (`broker_access_key`) is the one checked when the broker's ACL does not trust
        in-process peers."""
        from core.broker.local_send import LocalSend

        self.local_send = LocalSend.of(core_broker, self.config.broker_access_key)
        self.local_addr = core_broker.broker_addr
