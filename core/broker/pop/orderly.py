"""Orderly POP: FIFO message groups (docs/pop.md "FIFO message groups").

A pop is orderly when the consumer group is FIFO (`consumeMessageOrderly` in its
subscription-group config, as Apache's) or the request says `order=true`. Then a message
of a message group (property `__SHARDINGKEY`) is handed out only when no earlier message
of that group is in flight: a delivered message blocks the *rest of its group* (not the
queue) for that consumer group until it is acknowledged, dead-lettered, or its invisible
time passes (then it is delivered again, still before the later ones). So one pop holds
at most one message per group (the heads of several groups), and a consumer may work on
them in parallel. Messages without a group are not ordered (handed out as in a normal
pop).

A message read from the queue while its group is blocked is *held back*: kept in the
queue state as an in-flight entry that was never delivered (0 deliveries, visible, no
holder) and journaled like any other entry, so the consumed offset stays below it and a
restart keeps it. It goes out when its group is free again, in offset order. (A normal
pop of the same state hands held-back entries out as ordinary first deliveries.)

Bounded: at most `ORDERLY_MAX_PENDING` messages per (group, topic, queue) are in flight
or held back (then nothing new is read from that queue until acks); one pop reads at most
`ORDERLY_SCAN` messages beyond what it hands out. The message group of each entry is
remembered in memory (read back from the store once after a restart).
"""

from __future__ import annotations

from core.broker.pop.handle import build_extra_info
from core.common.codec import record_properties

__all__ = ["OrderlyPop", "ORDERLY_MAX_PENDING", "ORDERLY_SCAN", "SHARDING_KEY"]

#: Java's MessageConst.PROPERTY_SHARDING_KEY: the FIFO message group of a message.
SHARDING_KEY = "__SHARDINGKEY"
#: Most messages of one (group, topic, queue) in flight or held back in an orderly pop.
ORDERLY_MAX_PENDING = 1000
#: Most messages one orderly pop reads from a queue beyond the ones it hands out (the
#: ones of blocked groups, held back).
ORDERLY_SCAN = 64


def _message_group(buf) -> str:
    return record_properties(buf).get(SHARDING_KEY, "")


class OrderlyPop:
    """The orderly pops of a `PopService` (same state, journal and batches)."""

    def __init__(self, service) -> None:
        self.service = service
        #: (group, topic, queue) popped orderly -> {offset: message group} of its entries.
        self.queues: dict[tuple[str, str, int], dict[int, str]] = {}

    def wanted(self, group: str, order: bool) -> bool:
        """Whether a pop of `group` is orderly (the request's `order`, or a FIFO group)."""
        if order:
            return True
        sg = self.service.broker.subscription_group_manager.find_or_create(group)
        return bool(getattr(sg, "consume_message_orderly", False))

    def freed(self, group: str, topic: str, queue_id: int) -> None:
        """A message of an orderly queue left flight (ack, dead letter): the next of its
        group may go now, so wake the polls held on the topic."""
        if (group, topic, queue_id) in self.queues:
            self.service.on_dispatch(topic, queue_id, 0)

    # ------------------------------------------------------------------ pop
    def _blocked(self, key, qs, topic: str, qid: int) -> tuple[dict[int, str], set[str]]:
        """The group of every entry (learned from the store when unknown) and the groups
        with a message in flight (invisible, or on its way to the dead-letter topic)."""
        groups = self.queues.get(key)
        if groups is None:
            groups = self.queues[key] = {}
        inflight = qs.inflight
        if len(groups) > len(inflight):
            for offset in [o for o in groups if o not in inflight]:
                del groups[offset]
        store = self.service.broker.store
        blocked: set[str] = set()
        for offset, entry in inflight.items():
            g = groups.get(offset)
            if g is None:
                got = store.get(topic, qid, offset, 1)
                g = _message_group(got.buffers[0]) if got.buffers else ""
                groups[offset] = g
            if g and entry.deadline != 0:
                blocked.add(g)
        return groups, blocked

    def pop(self, group: str, topic: str, queue_ids: list[int], max_nums: int,
            invisible_ms: int, init_mode: int, filt, holder: str | None, now: int,
            volatile: bool = False):
        from core.broker.pop.reading import ADVANCE as _ADVANCE
        from core.broker.pop.reading import queue_offset as _queue_offset
        from core.broker.pop.reading import redelivery_record as _redelivery_record
        from core.broker.pop.service import PopBatch

        service = self.service
        store = service.broker.store
        config = service.broker.config
        state = service.state
        pop_time = state.new_pop_time(now)
        hold_time = 0  # pop time of the entries held back by this pop (its own)
        batch = PopBatch(pop_time)
        is_lmq = topic.startswith("%LMQ%")
        max_deliveries = service._max_deliveries(group)
        for qid in queue_ids:
            need = max_nums - batch.count
            if need <= 0:
                break
            key = (group, topic, qid)
            qs = service.queue_state(group, topic, qid, init_mode, volatile)
            journal = qs.journal  # DISCARD for a volatile state (journal.py)
            qs.expire(now)  # deadlines passed: not blocking any more
            groups, blocked = self._blocked(key, qs, topic, qid)
            cursor = qs.next_offset
            records: list = []  # (offset, buffer, deliveries)
            # Visible again and held back, lowest offset first: a group blocked by an
            # in-flight message keeps its place (put back afterwards).
            skipped = []
            for offset, entry in qs.take_visible(now, len(qs.inflight)):
                g = groups.get(offset, "")
                if len(records) >= need or (g and g in blocked):
                    skipped.append((offset, entry))
                    continue
                if entry.deliveries >= max_deliveries:
                    service._park(group, topic, qid, qs, offset, entry)
                    blocked.add(g)
                    continue
                got = store.get(topic, qid, offset, 1)
                if got.status.name != "FOUND" or not got.buffers:
                    qs.drop(offset)
                    journal.gone(group, topic, qid, offset)
                    continue
                qs.redeliver(offset, entry, pop_time, invisible_ms)
                service._hold(entry, holder, group, topic, qid, offset)
                records.append((offset, got.buffers[0], entry.deliveries))
                blocked.add(g)  # one message of a group in flight at a time
            for offset, entry in skipped:
                qs.make_visible(offset, entry)
            need -= len(records)
            room = ORDERLY_MAX_PENDING - len(qs.inflight)
            if need > 0 and room > 0:
                start = qs.next_offset
                got = store.get(topic, qid, start, min(room, need + ORDERLY_SCAN),
                                config.max_pull_bytes, filt)
                status = got.status.name
                end = got.next_begin_offset
                if status == "FOUND":
                    for buf in got.buffers:
                        offset = _queue_offset(buf, topic, is_lmq)
                        if need <= 0:
                            end = offset  # the rest is read again by the next pop
                            break
                        g = _message_group(buf)
                        groups[offset] = g
                        if g and g in blocked:
                            if not hold_time:
                                hold_time = state.new_pop_time(now)
                            qs.restore(offset, hold_time, 0, 0)
                            journal.hand(group, topic, qid, offset, hold_time, 0, 0, None)
                            continue
                        entry = qs.hand_out(offset, pop_time, invisible_ms)
                        service._hold(entry, holder, group, topic, qid, offset)
                        records.append((offset, buf, 1))
                        blocked.add(g)
                        need -= 1
                if end > qs.next_offset and status in _ADVANCE:
                    qs.next_offset = end
                batch.rest_num += max(got.max_offset - qs.next_offset, 0)
            if qs.next_offset != cursor:
                journal.cursor(group, topic, qid, qs.next_offset)
            if records:
                deadline = pop_time + invisible_ms
                service._schedule(key, deadline)
                offsets = [r[0] for r in records]
                for offset, _, deliveries in records:
                    journal.hand(group, topic, qid, offset, pop_time, deadline, deliveries,
                                 holder)
                ck = min(offsets)
                batch.start_offset_info.append(f"0 {qid} {ck}")
                batch.msg_offset_info.append(f"0 {qid} " + ",".join(map(str, offsets)))
                for offset, buf, deliveries in records:
                    if deliveries > 1:
                        handle = build_extra_info(ck, pop_time, invisible_ms, 0,
                                                  config.broker_name, qid, offset)
                        buf = _redelivery_record(buf, handle, deliveries - 1)
                    batch.buffers.append(buf)
            service._commit(group, topic, qid, qs)
        return batch
