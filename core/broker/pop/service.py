"""POP hand-out, acknowledgement and polling over the store (docs/pop.md).

`PopService` owns the broker's `PopState`. `pop` hands out up to `max_nums` messages of
(group, topic) from the given queues — redeliveries (visible again) first, lowest offset
first, then new messages from the pop cursor — and answers what the POP_MESSAGE response
needs. First deliveries are the stored records as they are (zero copy; clients build the
receipt handle from the response header, as Apache's clients do); a redelivery is
re-encoded with its POP_CK property and RECONSUMETIMES raised by one per earlier
delivery, as Apache re-encodes its pop-retry messages.

Long polling: `wait` parks a request until a message is dispatched to the topic, a message
of it is made visible again (nack), or its earliest deadline passes; dispatches reach it
through the broker's dispatch-listener hook, so nothing polls (waiters.py).
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field

import trio

from core.broker.message_util import clear_property, inner_from_record, put_property
from core.broker.pop.handle import build_extra_info
from core.broker.pop.journal import DISCARD, PopJournal, state_lines
from core.broker.pop.orderly import OrderlyPop
from core.broker.pop.reading import POP_CK, read_new
from core.broker.pop.reading import redelivery_record as _redelivery_record
from core.broker.pop.state import DEAD_LETTERING, PopState, QueueState
from core.broker.pop.waiters import PopWaiters
from core.common import names
from core.common.properties import MessageConst
from core.common.sysflag import PermName

log = logging.getLogger(__name__)

__all__ = ["PopService", "PopBatch", "PopStateFull", "POP_CK", "INIT_MODE_MIN",
           "INIT_MODE_MAX"]

INIT_MODE_MIN = 0
INIT_MODE_MAX = 1

#: Most messages one POP_MESSAGE may ask for (Apache's limit; INVALID_PARAMETER above).
POP_MAX_NUMS = 32
#: Longest invisible time accepted (ms; INVALID_PARAMETER above).
POP_MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Longest poll a POP_MESSAGE may hold (ms; longer requests are clamped).
POP_MAX_POLL_MS = 20_000
#: Most messages of one (group, topic, queue) in flight; past it only redeliveries go out.
POP_MAX_INFLIGHT_PER_QUEUE = 10_000
#: Most POP_MESSAGE requests held at once (POLLING_FULL beyond).
POP_MAX_POLLING = 10_000
#: Most (group, topic, queue) states a broker keeps (SYSTEM_BUSY for new ones beyond).
POP_MAX_QUEUE_STATES = 200_000
#: Period of the revive timer (s) and the most deadlines / dead-letterings it handles
#: per tick (the rest waits for the next tick).
POP_REVIVE_INTERVAL_S = 0.2
POP_REVIVE_BATCH = 2_000
POP_DLQ_BATCH = 64


class PopStateFull(Exception):
    """POP_MAX_QUEUE_STATES reached: no state for one more (group, topic, queue)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class PopBatch:
    """What one pop found: records to send and the response-header material."""

    pop_time: int
    buffers: list = field(default_factory=list)
    start_offset_info: list[str] = field(default_factory=list)
    msg_offset_info: list[str] = field(default_factory=list)
    rest_num: int = 0
    #: (queue id, offset) of each record, in body order (the in-process API's answer).
    placed: list[tuple[int, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.buffers)


class PopService(PopWaiters):
    """The broker's POP state and the operations the processors call."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.state = PopState()
        self._init_waiters()  # long polls and hand-offs (waiters.py)
        self._rotation = 0
        # (deadline, group, topic, queue): the revive timer's work; `_scheduled` holds
        # each queue's earliest pending entry (later deadlines are rescheduled from the
        # queue when it is due, so the heap stays O(queues)).
        self._due: list[tuple[int, str, str, int]] = []
        self._scheduled: dict[tuple[str, str, int], int] = {}
        # (group, topic, queue, offset, pop_time) parked for the dead-letter topic.
        self._dlq: deque[tuple[str, str, int, int, int]] = deque()
        self.dead_lettered = 0
        # holder id -> the (group, topic, queue) states it popped from: its deliveries
        # are the in-flight entries there whose `holder` is that id (kept per queue, not
        # per message, so hand-out and ack pay nothing for it).
        self._held: dict[str, set[tuple[str, str, int]]] = {}
        self.journal = PopJournal(os.path.join(broker.config.data_dir, "pop"))
        broker.add_lmq_dispatch_listener(self.on_dispatch_lmqs, self.on_dispatch)
        self.orderly = OrderlyPop(self)  # FIFO message groups (orderly.py)

    # ------------------------------------------------------------------ service
    def load(self) -> None:
        """Rebuild the state from the journal (before the broker listens)."""
        cursors: dict[tuple[str, str, int], int] = {}
        entries: dict[tuple[str, str, int], dict[int, tuple[int, int, int, str | None]]] = {}
        for rec in self.journal.replay():
            kind, key = rec[0], (rec[1], rec[2], rec[3])
            if kind == "C":
                cursors[key] = rec[4]
            elif kind == "H":
                entries.setdefault(key, {})[rec[4]] = (rec[5], rec[6], rec[7], rec[8])
            elif kind == "A":
                entries.get(key, {}).pop(rec[4], None)
        state = self.state
        last = 0
        now = now_ms()
        for key in cursors.keys() | entries.keys():
            found = entries.get(key, {})
            cursor = max(cursors.get(key, 0), max(found, default=-1) + 1)
            qs = state.get_or_create(*key, cursor, self.journal)
            for offset in sorted(found):
                pop_time, deadline, deliveries, holder = found[offset]
                entry = qs.restore(offset, pop_time, deadline, deliveries)
                if holder is not None and deadline > 0:
                    self._hold(entry, holder, *key, offset)
                last = max(last, pop_time)
            if found:
                self._schedule(key, now)
            self._commit(*key, qs)
        state.new_pop_time(last)
        self.journal.open()

    def persist(self) -> None:
        self.journal.close()

    async def compact_if_needed(self) -> None:
        state = self.state
        if not self.journal.needs_compaction(state.journaled_records()):
            return
        await self.journal.compact(state_lines(state.queues.items()))

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The revive timer: deadlines that passed make messages visible (waking polls),
        messages past the group's retryMaxTimes go to its %DLQ% topic."""
        task_status.started()
        while True:
            await trio.sleep(POP_REVIVE_INTERVAL_S)
            try:
                self.revive(now_ms())
                await self.dead_letter_some()
                await self.compact_if_needed()
            except Exception:
                log.exception("pop revive failed")

    def revive(self, now: int) -> int:
        """One tick of deadlines (bounded by POP_REVIVE_BATCH)."""
        due = self._due
        budget = POP_REVIVE_BATCH
        woken: set[str] = set()
        expired: list = []
        scheduled = self._scheduled
        while due and due[0][0] <= now and budget > 0:
            d, group, topic, qid = heapq.heappop(due)
            key = (group, topic, qid)
            if scheduled.get(key) != d:
                continue  # superseded by an earlier entry, already handled
            del scheduled[key]
            qs = self.state.get(group, topic, qid)
            if qs is None:
                continue
            expired.clear()
            budget -= qs.expire(now, budget, expired)
            if expired:
                max_deliveries = self._max_deliveries(group)
                for offset, entry in expired:
                    if entry.deliveries >= max_deliveries:
                        self._park(group, topic, qid, qs, offset, entry)
                    else:
                        woken.add(topic)
            nd = qs.next_deadline()
            if nd is not None:
                self._schedule(key, max(nd, now))  # later, or budget ran out
        for topic in woken:
            self.on_dispatch(topic, 0, 0)
        return POP_REVIVE_BATCH - budget

    def _schedule(self, key: tuple[str, str, int], deadline: int) -> None:
        current = self._scheduled.get(key)
        if current is None or deadline < current:
            self._scheduled[key] = deadline
            heapq.heappush(self._due, (deadline, *key))

    def _max_deliveries(self, group: str) -> int:
        """1 + the group's retryMaxTimes (as RocketMQ: that many redeliveries)."""
        sg = self.broker.subscription_group_manager.find_or_create(group)
        retry = sg.retry_max_times if sg is not None else self.broker.config.retry_max_times
        return 1 + max(retry, 0)

    def _park(self, group, topic, qid, qs: QueueState, offset: int, entry) -> None:
        qs.park(entry)
        self._dlq.append((group, topic, qid, offset, entry.pop_time))

    async def dead_letter_some(self) -> None:
        """Move up to POP_DLQ_BATCH parked messages to their group's %DLQ% topic."""
        for _ in range(min(len(self._dlq), POP_DLQ_BATCH)):
            item = self._dlq.popleft()
            try:
                done = await self._dead_letter(*item)
            except Exception:
                log.exception("pop: dead-lettering %r failed", item)
                done = False
            if not done:
                self._dlq.append(item)  # try again next tick

    async def _dead_letter(self, group: str, topic: str, qid: int, offset: int,
                           pop_time: int) -> bool:
        broker = self.broker
        qs = self.state.get(group, topic, qid)
        entry = qs.inflight.get(offset) if qs is not None else None
        if entry is None or entry.pop_time != pop_time or entry.deadline != DEAD_LETTERING:
            return True
        got = broker.store.get(topic, qid, offset, 1)
        if got.status.name == "FOUND" and got.buffers:
            dlq = names.dlq_topic(group)
            tc = broker.topic_config_manager.create_topic_in_send_back_method(
                dlq, 1, PermName.READ | PermName.WRITE, 0)
            if tc is None:
                return False
            inner = inner_from_record(got.buffers[0], topic=dlq, queue_id=0,
                                      store_host=broker.store_host)
            inner.reconsume_times += entry.deliveries
            if not inner.properties.get(MessageConst.RETRY_TOPIC):
                put_property(inner, MessageConst.RETRY_TOPIC, topic)
            for key in (MessageConst.INNER_MULTI_DISPATCH, MessageConst.INNER_MULTI_QUEUE_OFFSET,
                        MessageConst.DELAY_TIME_LEVEL, POP_CK):
                clear_property(inner, key)
            result = await broker.put_message(inner)
            if result.status.name not in ("OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT",
                                          "SLAVE_NOT_AVAILABLE"):
                return False
            self.dead_lettered += 1
        self._hold(entry, None, group, topic, qid, offset)
        qs.drop(offset)
        qs.journal.gone(group, topic, qid, offset)
        self.journal.flush()
        self._commit(group, topic, qid, qs)
        if self.orderly.queues:
            self.orderly.freed(group, topic, qid)
        return True

    def next_deadline(self, group: str, topic: str, queue_ids) -> int | None:
        best = None
        for qid in queue_ids:
            qs = self.state.get(group, topic, qid)
            if qs is None:
                continue
            d = qs.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        return best

    # ------------------------------------------------------------------ pop
    def _init_offset(self, group: str, topic: str, queue_id: int, init_mode: int) -> int:
        broker = self.broker
        committed = broker.offset_manager.query(group, topic, queue_id)
        if committed >= 0:
            return committed
        store = broker.store
        if init_mode == INIT_MODE_MIN:
            offset = store.min_offset(topic, queue_id)
        else:
            # Apache's MAX: start at the newest message already stored.
            offset = max(store.max_offset(topic, queue_id) - 1, 0)
        broker.offset_manager.commit(group, topic, queue_id, offset)
        return offset

    def queue_state(self, group: str, topic: str, queue_id: int, init_mode: int,
                    volatile: bool = False) -> QueueState:
        """The state, made when missing; `volatile`: not journaled, until a durable call
        (durable wins: its live state is journaled then; docs/pop.md "Volatile states")."""
        qs = self.state.get(group, topic, queue_id)
        if qs is None:
            if len(self.state.queues) >= POP_MAX_QUEUE_STATES:
                raise PopStateFull(f"{POP_MAX_QUEUE_STATES} POP queue states")
            start = self._init_offset(group, topic, queue_id, init_mode)
            qs = self.state.get_or_create(group, topic, queue_id, start,
                                          DISCARD if volatile else self.journal)
            # Journal the start at once (pop() flushes): a broker killed before the
            # periodic offset file would otherwise pick the start again after a
            # restart, and with init mode MAX skip what was sent meanwhile.
            qs.journal.cursor(group, topic, queue_id, start)
        elif not volatile and qs.journal is DISCARD:
            qs.journal = self.journal
            self.journal.lines(state_lines([((group, topic, queue_id), qs)]))
        return qs

    def rotate(self, queue_nums: int) -> list[int]:
        """All queue ids of a topic, starting at a rotating one (fairness)."""
        self._rotation = (self._rotation + 1) % max(queue_nums, 1)
        r = self._rotation
        return [(r + i) % queue_nums for i in range(queue_nums)]

    def pop(self, group: str, topic: str, queue_ids: list[int], max_nums: int,
            invisible_ms: int, init_mode: int, filt, holder: str | None = None,
            order: bool = False, volatile: bool = False) -> PopBatch:
        """Hand out up to `max_nums` messages (no awaiting: pops never interleave). The
        journal records are written before it returns, whatever happens. `order`: FIFO
        message groups (orderly.py); `volatile`: see `queue_state`."""
        try:
            if order:
                return self.orderly.pop(group, topic, queue_ids, max_nums, invisible_ms,
                                        init_mode, filt, holder, now_ms(), volatile)
            return self._pop(group, topic, queue_ids, max_nums, invisible_ms, init_mode, filt,
                             holder, volatile)
        finally:
            self.journal.flush()

    def _pop(self, group: str, topic: str, queue_ids: list[int], max_nums: int,
             invisible_ms: int, init_mode: int, filt, holder, volatile: bool) -> PopBatch:
        broker = self.broker
        store = broker.store
        config = broker.config
        now = now_ms()
        pop_time = self.state.new_pop_time(now)
        batch = PopBatch(pop_time)
        broker_name = config.broker_name
        is_lmq = names.is_lmq(topic)
        max_deliveries = self._max_deliveries(group)
        for qid in queue_ids:
            need = max_nums - batch.count
            if need <= 0:
                break
            qs = self.queue_state(group, topic, qid, init_mode, volatile)
            journal, cursor = qs.journal, qs.next_offset
            offsets: list[int] = []
            records: list = []
            if need > 0:
                # Redeliveries first.
                for offset, entry in qs.take_visible(now, need):
                    if entry.deliveries >= max_deliveries:
                        self._park(group, topic, qid, qs, offset, entry)
                        continue
                    got = store.get(topic, qid, offset, 1)
                    if got.status.name != "FOUND" or not got.buffers:
                        qs.drop(offset)  # gone from the store (retention)
                        journal.gone(group, topic, qid, offset)
                        continue
                    qs.redeliver(offset, entry, pop_time, invisible_ms)
                    entry.holder = holder
                    records.append((offset, got.buffers[0], entry.deliveries))
                    offsets.append(offset)
                need = max_nums - batch.count - len(records)
                if need > 0 and len(qs.inflight) < POP_MAX_INFLIGHT_PER_QUEUE:
                    need = min(need, POP_MAX_INFLIGHT_PER_QUEUE - len(qs.inflight))
                    placed, cursor_to, max_offset = read_new(
                        store, topic, qid, qs.next_offset, need, config.max_pull_bytes, filt,
                        is_lmq)
                    for offset, buf in placed:
                        entry = qs.hand_out(offset, pop_time, invisible_ms)
                        entry.holder = holder
                        records.append((offset, buf, 1))
                        offsets.append(offset)
                    if cursor_to > qs.next_offset:
                        qs.next_offset = cursor_to
                    batch.rest_num += max(max_offset - qs.next_offset, 0)
            if qs.next_offset != cursor:
                journal.cursor(group, topic, qid, qs.next_offset)
            if records:
                if holder is not None:
                    self._held.setdefault(holder, set()).add((group, topic, qid))
                deadline = pop_time + invisible_ms
                self._schedule((group, topic, qid), deadline)
                if all(r[2] == 1 for r in records):  # first deliveries: one record
                    journal.hand_many(group, topic, qid, offsets, pop_time, deadline, 1, holder)
                else:
                    for offset, _, deliveries in records:
                        journal.hand(group, topic, qid, offset, pop_time, deadline, deliveries,
                                     holder)
                ck = min(offsets)
                batch.start_offset_info.append(f"0 {qid} {ck}")
                batch.msg_offset_info.append(f"0 {qid} " + ",".join(map(str, offsets)))
                batch.placed += [(qid, o) for o in offsets]
                for offset, buf, deliveries in records:
                    if deliveries > 1:
                        handle = build_extra_info(ck, pop_time, invisible_ms, 0, broker_name,
                                                  qid, offset)
                        buf = _redelivery_record(buf, handle, deliveries - 1)
                    batch.buffers.append(buf)
            self._commit(group, topic, qid, qs)
        return batch

    # ------------------------------------------------------------------ holders
    def _hold(self, entry, holder: str | None, group: str, topic: str, qid: int,
              offset: int) -> None:
        entry.holder = holder
        if holder is not None:
            self._held.setdefault(holder, set()).add((group, topic, qid))

    def release(self, holder: str) -> int:
        """Make every delivery `holder` holds visible again at once (a gateway that
        crashed or restarted); the number released."""
        released = 0
        topics: set[str] = set()
        mine = [(key, offset, entry) for key in self._held.pop(holder, ())
                if (qs := self.state.get(*key)) is not None
                for offset, entry in qs.inflight.items()
                if entry.holder == holder and entry.deadline > 0]
        for (group, topic, qid), offset, entry in mine:
            qs = self.state.get(group, topic, qid)
            entry.holder = None
            new_pop_time = self.state.new_pop_time(now_ms())
            qs.change(offset, entry.pop_time, new_pop_time, 0)
            qs.journal.hand(group, topic, qid, offset, new_pop_time, 0, entry.deliveries)
            if entry.deliveries >= self._max_deliveries(group):
                self._park(group, topic, qid, qs, offset, entry)
            released += 1
            topics.add(topic)
        self.journal.flush()
        for topic in topics:
            self.on_dispatch(topic, 0, 0)
        return released

    def _commit(self, group: str, topic: str, queue_id: int, qs: QueueState) -> None:
        committed = qs.committed()
        om = self.broker.offset_manager
        if om.query(group, topic, queue_id) != committed:
            om.commit(group, topic, queue_id, committed)

    # ------------------------------------------------------------------ ack / change
    def ack(self, group: str, topic: str, queue_id: int, offset: int, pop_time: int,
            flush: bool = True, commit: bool = True) -> bool:
        """Acknowledge; with `flush` False the caller flushes the journal, with `commit`
        False it calls `commit_acks` (batches)."""
        qs = self.state.get(group, topic, queue_id)
        entry = qs.inflight.get(offset) if qs is not None else None
        if entry is None or not qs.ack(offset, pop_time):
            return False
        qs.journal.gone(group, topic, queue_id, offset)
        if flush:
            self.journal.flush()
        if commit:
            self._commit(group, topic, queue_id, qs)
        if self.orderly.queues:
            self.orderly.freed(group, topic, queue_id)
        return True

    def ack_bits(self, group: str, topic: str, queue_id: int, start: int, bits: bytes,
                 pop_time: int) -> int:
        """BATCH_ACK's entry: acknowledge offset `start + i` for every bit `i` set in
        `bits` (Java's BitSet bytes) under `pop_time`; commits the group's offset once.
        The journal is flushed by the caller. How many were acknowledged."""
        offsets: list[int] = []
        for i, byte in enumerate(bits):
            if not byte:
                continue
            base = start + i * 8
            offsets += [base + j for j in range(8) if byte >> j & 1]
        return self.ack_offsets(group, topic, queue_id, offsets, pop_time)

    def ack_offsets(self, group: str, topic: str, queue_id: int, offsets: list[int],
                    pop_time: int) -> int:
        """Acknowledge `offsets` of one queue handed out under `pop_time` (one journal
        record, one offset commit); the caller flushes the journal. How many were
        acknowledged (those not in flight under that pop time are skipped)."""
        qs = self.state.get(group, topic, queue_id)
        if qs is None:
            return 0
        inflight = qs.inflight
        acked = [o for o in offsets if o in inflight and qs.ack(o, pop_time)]
        if acked:
            qs.journal.gone_many(group, topic, queue_id, acked)
            self._commit(group, topic, queue_id, qs)
            orderly = getattr(self, "orderly", None)  # FIFO message groups, as in ack()
            if orderly is not None and orderly.queues:
                orderly.freed(group, topic, queue_id)
        return len(acked)

    def commit_acks(self, group: str, topic: str, queue_id: int) -> None:
        """Move the group's committed offset past what `ack(commit=False)` acknowledged."""
        qs = self.state.get(group, topic, queue_id)
        if qs is not None:
            self._commit(group, topic, queue_id, qs)

    def dead_letter(self, group: str, topic: str, queue_id: int, offset: int,
                    pop_time: int) -> bool:
        """Reject without requeue: the message goes to the group's %DLQ% topic (by the
        revive timer, within a tick) and is never delivered again."""
        qs = self.state.get(group, topic, queue_id)
        entry = qs.inflight.get(offset) if qs is not None else None
        if entry is None or entry.pop_time != pop_time or entry.deadline == DEAD_LETTERING:
            return False
        self._park(group, topic, queue_id, qs, offset, entry)
        return True

    def purge(self, group: str, topic: str, queue_id: int, everything: bool = False,
              volatile: bool = False) -> int:
        """Drop the messages of (group, topic, queue) that wait for delivery: the ones
        never handed out (the cursor moves to the queue's end) and the ones visible
        again. Deliveries awaiting acknowledgement stay, unless `everything` (the queue
        is being deleted: its state goes too). Returns how many waiting messages were
        dropped (unacknowledged ones are not counted). `volatile`: of a missing state."""
        key = (group, topic, queue_id)
        qs = self.state.get(*key) or self.queue_state(*key, INIT_MODE_MIN, volatile)
        journal = qs.journal
        end = max(self.broker.store.max_offset(topic, queue_id), qs.next_offset)
        purged = end - qs.next_offset
        for offset, entry in list(qs.inflight.items()):
            if entry.deadline == DEAD_LETTERING:
                continue  # the revive timer is storing it in the %DLQ% topic
            if entry.deadline != 0 and not everything:
                continue
            qs.drop(offset)
            journal.gone(group, topic, queue_id, offset)
            if entry.deadline == 0:
                purged += 1  # counted as RabbitMQ does: ready messages only
        if end != qs.next_offset:
            qs.next_offset = end
            journal.cursor(group, topic, queue_id, end)
        self.journal.flush()
        self._commit(group, topic, queue_id, qs)
        if everything and not qs.inflight:
            del self.state.queues[key]
        return purged

    def change_invisible(self, group: str, topic: str, queue_id: int, offset: int,
                         pop_time: int, invisible_ms: int) -> int | None:
        """The new pop time, or None when the handle is not current."""
        qs = self.state.get(group, topic, queue_id)
        if qs is None:
            return None
        new_pop_time = self.state.new_pop_time(now_ms())
        if not qs.change(offset, pop_time, new_pop_time, invisible_ms):
            return None
        entry = qs.inflight[offset]
        qs.journal.hand(group, topic, queue_id, offset, new_pop_time, entry.deadline,
                          entry.deliveries, entry.holder)
        self.journal.flush()
        if invisible_ms <= 0 and entry.deliveries >= self._max_deliveries(group):
            self._park(group, topic, queue_id, qs, offset, entry)  # budget spent: DLQ
        if invisible_ms <= 0:
            self.on_dispatch(topic, queue_id, 0)
        else:
            self._schedule((group, topic, queue_id), new_pop_time + invisible_ms)
        return new_pop_time
