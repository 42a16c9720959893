"""Scheduled (delayed) messages: `SCHEDULE_TOPIC_XXXX`, one queue per delay level
(docs/protocol.md §9.1, §9.2).

A message with `DELAY=n` is stored in queue n-1 of `SCHEDULE_TOPIC_XXXX` with its real
destination in `REAL_TOPIC`/`REAL_QID`; the consume-queue tag slot holds its delivery time
(epoch ms). Within one level every message waits the same time, so each queue is ordered
by delivery time and a cursor per level is enough: deliver from the cursor while the head
is due, stop at the first message that is not.

Delivery re-reads the record, restores topic and queue, drops `DELAY`, lets the store hash
TAGS again, and appends it as a new record through `broker.put_message` (so SYNC_FLUSH
rules hold). Progress (level -> next consume-queue offset) is persisted atomically in
`<data_dir>/config/delayOffset.json` (`{"offsetTable": {"1": 5, ...}}`, Java's file name)
after every delivery batch and at shutdown. After a crash the messages delivered since the
last persisted batch are delivered again (at-least-once, as Java); nothing is lost because
the scheduled records are in the store.

Waking up: one task sleeps until the earliest known due time. `divert()` runs for every
new scheduled message (the send processor, send-back and transaction commit) and knows
its due time, so it shortens the sleep when needed; no dispatch hook is needed. The
message is only in the consume queue once the caller's put has run, so `divert` leaves
its due time as a hint and the queue is read when the hint is due (see `_pass`). A slow
safety poll (`schedule_poll_interval_s`, default 5 s) also looks at levels with nothing
known, for messages stored without divert() (none today) and wall-clock jumps.

Exact delivery times (RocketMQ 5 `delivery_timestamp`, stored as `TIMER_DELIVER_MS`):
such a message cascades through the levels instead of being rounded up to one. divert()
puts it in the largest level not longer than the time left (level 1 when less is left;
its tag slot is then the delivery time itself, so the level's own due-time wake-up
delivers it on time, at worst behind a level-1 head: at most one smallest level late).
When a hop comes due and TIMER_DELIVER_MS is still ahead, the message is diverted again
with the time left and put as a normal scheduled message: it is always stored in some
level queue, so a crash mid-cascade loses nothing (the hop may repeat). Hops are bounded:
the time left is capped at `timer_max_delay_s` (default 3 days, Apache's
timerMaxDelaySec; a send whose TIMER_DELIVER_MS lies further ahead is refused with
MESSAGE_ILLEGAL, as Apache's broker refuses it: `check_timer`, at a half message's send
too; a later one reaching divert() by another path, a half message stored before that
check or under a larger limit, is rewritten to it at commit) and every hop but the
last takes at least the chosen level's delay off it. A message whose TIMER_DELIVER_MS is already past when it is diverted (a
consumer's send-back of a delivered 5.x delayed message) uses its DELAY level as a 4.x
message does. See docs/grpc.md "Delivery times".

Timer messages (Apache RocketMQ 5's properties, sent by a 4.x/5.x remoting producer with no
DELAY level): `TIMER_DELAY_SEC`, else `TIMER_DELAY_MS`, else `TIMER_DELIVER_MS`, checked
by `check_timer` at send (a half message too) and held by `hold`: the relative ones become
an absolute TIMER_DELIVER_MS at send, and the message cascades as above. A value that is
not a whole number, or a time beyond `timer_max_delay_s`, is refused (MESSAGE_ILLEGAL); a
time already past is delivered at once. See docs/protocol.md §9.2 "Timer messages".
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from typing import TYPE_CHECKING

import trio

from core.broker.cursor_file import CursorFile
from core.broker.message_util import (
    clear_property,
    delay_level,
    inner_from_record,
    put_property,
    real_destination,
)
from core.broker.metadata import encode_json, read_json
from core.common.codec import RecordError
from core.common.message import InnerMessage
from core.common.names import SCHEDULE_TOPIC
from core.common.properties import MessageConst

if TYPE_CHECKING:
    from core.broker.controller import BrokerController

log = logging.getLogger(__name__)

__all__ = ["ScheduleMessageService", "parse_delay_levels"]

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE = re.compile(r"^(\d+)([smhd])$")

#: Messages delivered per level before progress is persisted and other levels get a turn.
DELIVER_BATCH = 32
#: Default safety poll of each level's queue (`schedule_poll_interval_s`); divert() wakes
#: the service for new messages, so this only bounds how late a message stored some other
#: way is noticed.
DEFAULT_POLL_INTERVAL_S = 5.0
#: Pause before retrying a level whose re-put failed transiently (Java waits 10 s).
DEFAULT_RETRY_INTERVAL_S = 1.0
#: Default `timer_max_delay_s`: the furthest a delivery time (TIMER_DELIVER_MS) may lie
#: ahead (Apache's timerMaxDelaySec). The 5.x front end refuses beyond it with
#: ILLEGAL_DELIVERY_TIME, the broker's send path with MESSAGE_ILLEGAL (`check_timer`).
DEFAULT_TIMER_MAX_DELAY_S = 3 * 86_400
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
#: Apache 5's relative timer properties (seconds / ms from the send); they win over
#: TIMER_DELIVER_MS, seconds first, as in Apache's broker.
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
_TIMER_UNITS = ((TIMER_DELAY_SEC, 1000), (TIMER_DELAY_MS, 1))
# A Java long as Long.parseLong reads it (optional sign, ASCII digits).
_LONG_RE = re.compile(r"[+-]?[0-9]{1,19}")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1

# Put results after which the message counts as delivered (FLUSH_DISK_TIMEOUT: stored,
# only the fsync wait timed out) and those worth retrying; anything else (an illegal
# message) can never succeed and is skipped.
_DELIVERED = frozenset({"OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})
_TRANSIENT = frozenset({"SERVICE_NOT_AVAILABLE", "UNKNOWN_ERROR"})


def parse_delay_levels(text: str) -> list[int]:
    """`"1s 5s 10s ... 2h"` -> delay of each level in ms (index 0 = level 1).

    Units s, m, h, d as in Java's `messageDelayLevel` (docs/protocol.md §9.1). Raises ValueError on an
    empty list or a malformed entry, so a bad config fails at startup.
    """
    delays: list[int] = []
    for item in text.split():
        m = _LEVEL_RE.match(item.strip().lower())
        if m is None:
            raise ValueError(f"bad delay level {item!r} in message_delay_level {text!r}")
        delays.append(int(m.group(1)) * _UNIT_MS[m.group(2)])
    if not delays:
        raise ValueError("message_delay_level defines no level")
    return delays


def _now_ms() -> int:
    return int(time.time() * 1000)


def _deliver_ms(properties: dict) -> int | None:
    """TIMER_DELIVER_MS of a message (epoch ms), None when absent or malformed."""
    value = properties.get(TIMER_DELIVER_MS)
    if not value:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class ScheduleMessageService(CursorFile):
    """Delay levels, diverting scheduled messages, and their timely delivery (docs/protocol.md §9.2)."""

    FILE_NAME = "delayOffset.json"

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        config = broker.config
        self.delays_ms: list[int] = parse_delay_levels(config.message_delay_level)
        self.max_level = len(self.delays_ms)
        self._open_cursor_file(os.path.join(config.data_dir, "config", self.FILE_NAME))
        self.poll_interval_s = max(
            0.01, float(getattr(config, "schedule_poll_interval_s", DEFAULT_POLL_INTERVAL_S))
        )
        self.retry_interval_s = float(
            getattr(config, "schedule_retry_interval_s", DEFAULT_RETRY_INTERVAL_S)
        )
        self.timer_max_delay_ms = 1000 * int(
            getattr(config, "timer_max_delay_s", DEFAULT_TIMER_MAX_DELAY_S))
        self.hops = 0  # cascade re-diverts (runtime info)
        #: level -> next consume-queue offset to deliver (persisted).
        self.offset_table: dict[int, int] = {}
        # level -> due time (ms) of the message at the cursor; None = nothing known.
        self._head_due: dict[int, int | None] = {}
        # level -> [earliest, latest] due time announced by divert() that the queue may
        # not show yet (see _pass).
        self._hints: dict[int, list[int]] = {}
        self._planned_wake_ms: float = math.inf
        self._wakeup = trio.Event()
        self.delivered = 0  # counters for runtime info
        self.skipped = 0
        #: Recall marks (processors/recall.py): recalled messages are dropped when due.
        self.recalls = None
        # Recovery re-dispatches lost CQ units from the CommitLog; our units must get the
        # delivery time back in their tag slot, not the TAGS hash (docs/protocol.md §7.10).
        store = getattr(broker, "store", None)
        if store is not None and getattr(store, "tags_code_resolver", None) is None:
            store.tags_code_resolver = self.recovered_tags_code

    # ------------------------------------------------------------------ levels
    def delay_ms(self, level: int) -> int:
        """Delay of `level` (clamped to 1..max_level) in ms."""
        return self.delays_ms[min(max(level, 1), self.max_level) - 1]

    def recovered_tags_code(self, topic: str, properties: dict, store_ms: int) -> int | None:
        """Tag slot of a record re-dispatched at recovery: for a scheduled message its
        delivery time (store time + its level's delay), else None (hash of TAGS)."""
        if topic != SCHEDULE_TOPIC:
            return None
        level = delay_level(properties)
        if level <= 0:
            return store_ms
        due = store_ms + self.delay_ms(level)
        target = _deliver_ms(properties)
        return due if target is None else max(store_ms, min(due, target))

    def cascade_level(self, left_ms: int) -> int:
        """The largest level not longer than `left_ms` (1 when none is)."""
        level = 1
        for i, delay in enumerate(self.delays_ms):
            if delay <= left_ms and delay >= self.delays_ms[level - 1]:
                level = i + 1
        return level

    # ------------------------------------------------------------------ persistence
    def load(self) -> None:
        """Read delayOffset.json (missing file = start every level at offset 0)."""
        data = read_json(self.path, {}) or {}
        table = data.get("offsetTable") if isinstance(data, dict) else None
        for key, value in (table or {}).items():
            try:
                level, offset = int(key), int(value)
            except (TypeError, ValueError):
                continue
            if 1 <= level <= self.max_level and offset >= 0:
                self.offset_table[level] = offset
        self._head_due.clear()

    def _snapshot(self) -> bytes:
        """The file's content, encoded on the event loop (where the table changes)."""
        self._dirty = False
        return encode_json(self.offset_table_json())

    def offset_table_json(self) -> dict:
        """The persisted form (Java's GET_ALL_DELAY_OFFSET body)."""
        return {"offsetTable": {str(k): v for k, v in sorted(self.offset_table.items())}}

    # ------------------------------------------------------------------ send path
    def too_far_ahead(self, properties: dict) -> bool:
        """Whether a message's TIMER_DELIVER_MS lies more than `timer_max_delay_s` ahead
        (the send path refuses it: MESSAGE_ILLEGAL, as Apache's broker)."""
        target = _deliver_ms(properties)
        return target is not None and target - _now_ms() > self.timer_max_delay_ms

    def check_timer(self, inner: InnerMessage) -> str | None:
        """The send path's check of a delivery time (a half message's too): None to go
        on, or why the message is refused (MESSAGE_ILLEGAL, as Apache's broker answers a
        timer message it cannot take). Without a DELAY level the relative timer
        properties are replaced by the absolute TIMER_DELIVER_MS they mean, so the
        time counts from this send; `hold` then schedules the message."""
        props = inner.properties
        if delay_level(props) <= 0:
            name, unit = next(((n, u) for n, u in _TIMER_UNITS if n in props),
                              (TIMER_DELIVER_MS, 0))
            value = props.get(name)
            if value is None:
                return None
            now = _now_ms()
            number = int(value) if _LONG_RE.fullmatch(value) else None
            if number is None or not _LONG_MIN <= number <= _LONG_MAX:
                return f"timer message illegal: {name}={value[:32]!r} is not a whole number"
            target = now + number * unit if unit else number
            if target <= now:  # already due: delivered at once, as in Apache
                if unit:
                    props.pop(TIMER_DELIVER_MS, None)  # the relative one won
                return None
            if target - now > self.timer_max_delay_ms:
                return self._too_far()
            put_property(inner, TIMER_DELIVER_MS, target)
        for relative, _ in _TIMER_UNITS:  # beside a level they are dropped, as in Apache
            props.pop(relative, None)
        return self._too_far() if self.too_far_ahead(props) else None

    def _too_far(self) -> str:
        return ("timer message illegal: its delivery time lies more than "
                f"{self.timer_max_delay_ms} ms ahead (timer_max_delay_s)")

    def hold(self, inner: InnerMessage) -> None:
        """Divert a message with a DELAY level, or one whose TIMER_DELIVER_MS (set by
        `check_timer`) is still ahead; anything else is left to be delivered at once."""
        if delay_level(inner.properties) <= 0:
            target = _deliver_ms(inner.properties)
            if target is None or target <= _now_ms():
                return
            put_property(inner, MessageConst.DELAY_TIME_LEVEL, 1)  # divert picks the hop
        self.divert(inner)

    def divert(self, inner: InnerMessage) -> None:
        """Rewrite a message with DELAY>0 into `SCHEDULE_TOPIC_XXXX` (docs/protocol.md §9.2), in place.

        Levels above the maximum are clamped (and DELAY rewritten). The caller then puts
        `inner` as usual; the response to the producer describes the scheduled record.
        """
        level = delay_level(inner.properties)
        if level <= 0:
            return
        now = _now_ms()
        due = None
        target = _deliver_ms(inner.properties)
        if target is not None and target > now:
            # An exact delivery time: the next hop of the cascade (module docstring).
            left = target - now
            if left > self.timer_max_delay_ms:  # capped once, so the hops stay bounded
                left = self.timer_max_delay_ms
                put_property(inner, TIMER_DELIVER_MS, now + left)
            level = self.cascade_level(left)
            due = now + min(left, self.delays_ms[level - 1])
            put_property(inner, MessageConst.DELAY_TIME_LEVEL, level)
        elif level > self.max_level:
            level = self.max_level
            put_property(inner, MessageConst.DELAY_TIME_LEVEL, level)
        put_property(inner, MessageConst.REAL_TOPIC, inner.topic)
        put_property(inner, MessageConst.REAL_QUEUE_ID, inner.queue_id)
        inner.topic = SCHEDULE_TOPIC
        inner.queue_id = level - 1
        if due is None:
            due = now + self.delays_ms[level - 1]
        inner.tags_code = due
        hint = self._hints.get(level)
        if hint is None:
            self._hints[level] = [due, due]
        else:
            hint[0] = min(hint[0], due)
            hint[1] = max(hint[1], due)
        if due < self._planned_wake_ms:
            self._wakeup.set()

    # ------------------------------------------------------------------ delivery loop
    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver due messages until cancelled; persists progress on the way out."""
        task_status.started()
        try:
            while True:
                self._wakeup = trio.Event()
                self._planned_wake_ms = math.inf  # any divert during the pass re-wakes us
                earliest = await self._pass()
                if self._dirty:
                    await self._persist_in_thread()
                now = _now_ms()
                if earliest <= now:
                    await trio.sleep(0)
                    continue
                self._planned_wake_ms = earliest
                timeout = min((earliest - now) / 1000, self.poll_interval_s)
                with trio.move_on_after(timeout):
                    await self._wakeup.wait()
        finally:
            self._persist_at_shutdown()

    async def _pass(self) -> float:
        """One look at every level that may have something due; returns the earliest due
        time still pending.

        A level is read when its head is due, when a divert()ed message is due, or when
        nothing is known about it. A divert()ed message could still be in flight (its
        put not run yet) when the queue is read, so the hint stays until a read at or
        after the latest announced due time. (Today the window is empty: every caller
        puts right after divert(), and `broker.put_message` appends before it awaits.)
        """
        now = _now_ms()
        earliest: float = math.inf
        for level in range(1, self.max_level + 1):
            delay = self.delays_ms[level - 1]
            head = self._head_due.get(level)
            hint = self._hints.get(level)
            look = head is None or head <= now or head > now + delay
            if hint is not None and hint[0] <= now:
                look = True
            if look:
                try:
                    head = await self._deliver_level(level, now)
                except Exception:  # a bug must not stop delayed delivery for good
                    log.exception("delay level %d: delivery failed", level)
                    head = now + int(self.retry_interval_s * 1000)
                self._head_due[level] = head
                if hint is not None and hint[0] <= now:
                    if hint[1] <= now:
                        del self._hints[level]
                        hint = None
                    else:
                        hint[0] = hint[1]
            if head is not None:
                earliest = min(earliest, head)
            if hint is not None:
                earliest = min(earliest, hint[0])
        return earliest

    async def _deliver_level(self, level: int, now: int) -> int | None:
        """Deliver up to DELIVER_BATCH due messages of `level`.

        Returns the due time of the message now at the cursor (`now` when more are due
        already), or None when the queue has nothing beyond the cursor.
        """
        store = self.broker.store
        queue_id = level - 1
        offset = self.offset_table.get(level, 0)
        max_offset = store.max_offset(SCHEDULE_TOPIC, queue_id)
        if offset == max_offset:
            return None
        if offset > max_offset:
            # The store lost data the progress file still counts (e.g. a wiped store):
            # start over at its end rather than wait for the queue to regrow.
            self._set_offset(level, max_offset)
            return None
        min_offset = store.min_offset(SCHEDULE_TOPIC, queue_id)
        if offset < min_offset:
            offset = min_offset  # retention removed the head
            self._set_offset(level, offset)
        delivered = 0
        delay = self.delays_ms[queue_id]
        while offset < max_offset and delivered < DELIVER_BATCH:
            units = store.units(SCHEDULE_TOPIC, queue_id, offset, DELIVER_BATCH - delivered)
            if not units:
                return now + int(self.retry_interval_s * 1000)
            for phys, _size, due in units:
                if due > now + delay:
                    # Due later than a full delay from now: the wall clock went back.
                    # Deliver now, as Java's correctDeliverTimestamp does.
                    due = now
                if due > now:
                    return due
                outcome = await self._deliver_one(phys, level)
                if outcome == "retry":
                    return _now_ms() + int(self.retry_interval_s * 1000)
                offset += 1
                delivered += 1
                self._set_offset(level, offset)
        if offset < max_offset:
            return now
        return None

    def _set_offset(self, level: int, offset: int) -> None:
        self.offset_table[level] = offset
        self._dirty = True

    async def _deliver_one(self, phys: int, level: int) -> str:
        """Re-put one scheduled record to its real queue: "ok", "skip" or "retry"."""
        record = self.broker.store.read_record(phys)
        if record is None:
            log.warning("delay level %d: record at %d is gone; skipped", level, phys)
            self.skipped += 1
            return "skip"
        try:
            inner = inner_from_record(record, store_host=self.broker.store_host)
        except RecordError as exc:
            log.warning("delay level %d: record at %d unreadable (%s); skipped", level, phys, exc)
            self.skipped += 1
            return "skip"
        dest = real_destination(inner.properties)
        if dest is None:
            log.warning("delay level %d: record at %d has no REAL_TOPIC; skipped", level, phys)
            self.skipped += 1
            return "skip"
        if self.recalls is not None and self.recalls.take(
                dest[0], inner.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)):
            return "skip"  # recalled (RECALL_MESSAGE)
        inner.topic, inner.queue_id = dest
        target = _deliver_ms(inner.properties)
        if target is not None and target > _now_ms():
            self.divert(inner)  # still ahead: the next hop (module docstring)
        else:
            clear_property(inner, MessageConst.DELAY_TIME_LEVEL)
            inner.tags_code = None  # the store hashes TAGS again
        try:
            result = await self.broker.put_message(inner)
        except Exception:
            log.exception("delay level %d: re-put of %d failed; will retry", level, phys)
            return "retry"
        status = getattr(result.status, "name", str(result.status))
        if status in _DELIVERED:
            if inner.topic == SCHEDULE_TOPIC:
                self.hops += 1
            else:
                self.delivered += 1
            return "ok"
        if status in _TRANSIENT:
            return "retry"
        log.warning(
            "delay level %d: re-put of %d refused (%s %s); skipped",
            level, phys, status, result.remark,
        )
        self.skipped += 1
        return "skip"
