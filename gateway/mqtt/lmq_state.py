"""What the gateway knows of one LMQ (`LmqState`) and the light read of its entries.

`LmqState` per (broker, LMQ) lets sessions read LMQs without long-polling each of them (see
broker_link.py). `pull_views` is the pull behind a reader that left the recent entries:
records read as views, topic, QoS and payload straight from the record bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter
from typing import Any

from core.client import ClientInstance, PullResult, PullStatus
from core.client.model import SubscriptionData
from core.common.sysflag import PullSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from core.store.record_view import iter_record_views
from gateway.mqtt.message import MqttMessage, from_record_view

__all__ = ["LmqState", "MessageCache", "RECENT_BYTES", "RECENT_ENTRIES", "RecentBudget",
           "pull_views"]

_PAYLOAD = attrgetter("payload")

#: Entries (and payload bytes) of one LMQ kept for the sessions reading it.
RECENT_ENTRIES = 4096
RECENT_BYTES = 2 * 1024 * 1024


class RecentBudget:
    """Payload bytes held in the recent entries of all the LMQs of one gateway, and the
    most they may hold (`max_recent_bytes`). Past it, the oldest entries of the LMQ
    written longest ago go first (an idle LMQ does not keep its entries at the expense of
    busy ones); the LMQ being written keeps at least its newest. Readers behind pull."""

    __slots__ = ("used", "limit", "order")

    def __init__(self, limit: int) -> None:
        self.used = 0
        self.limit = limit
        #: LMQ states holding entries, least recently written first
        self.order: OrderedDict[LmqState, None] = OrderedDict()

    def trim(self, keep: LmqState) -> None:
        """Forget entries until within the limit (`keep`, just written, goes last)."""
        order = self.order
        while self.used > self.limit and order:
            st = next(iter(order))
            recent = st.recent
            floor = 1 if st is keep else 0
            while len(recent) > floor and self.used > self.limit:
                gone = len(recent.popitem(last=False)[1].payload)
                st._recent_bytes -= gone
                self.used -= gone
            if st is keep:
                return
            if not recent:
                del order[st]


class MessageCache(OrderedDict):
    """Messages parsed from pulls, by (broker, commitlog offset), so that overlapping
    filters do not parse them again; bounded by entries and by payload bytes (a cache of
    4096 messages of 1 MiB would otherwise hold 4 GiB). Oldest entries go first."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0

    def __setitem__(self, key, msg) -> None:
        old = self.get(key)
        if old is not None:
            self.bytes -= len(old.payload)
        super().__setitem__(key, msg)
        self.bytes += len(msg.payload)
        while len(self) > 1 and (len(self) > self.max_entries or self.bytes > self.max_bytes):
            self.bytes -= len(self.popitem(last=False)[1].payload)

    def __delitem__(self, key) -> None:
        self.bytes -= len(self[key].payload)
        super().__delitem__(key)

Waker = Any  # an object with a `wake()` method (a session's delivery pump)

_PULL_FLAGS = str(int(PullSysFlag.SUBSCRIPTION))
_PULL_CODES = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


class LmqState:
    """What the gateway knows of one LMQ on one broker (see the module doc).

    `tail` is the offset the next write will get, when known: learnt from a pull that
    found the end with no write in progress, then advanced by the dispatcher for each
    message it stores (it is the only writer of its LMQs). While it is known, stored
    messages enter `recent` at their offsets directly and readers at the end need no pull.
    """

    __slots__ = ("broker", "lmq", "pending", "version", "watchers", "recent", "_recent_bytes",
                 "tail", "sub", "top", "pulling", "pull_waiters", "budget")

    def __init__(self, broker: str, lmq: str, budget: RecentBudget | None = None) -> None:
        self.broker = broker
        self.lmq = lmq
        self.pending = 0
        self.version = 0
        self.watchers: set[Waker] = set()
        # Oldest first. An OrderedDict: evicting from the front of a plain dict makes
        # next(iter(d)) walk the deleted slots (measured: 8 % of a fan-in's CPU).
        self.recent: OrderedDict[int, MqttMessage] = OrderedDict()
        self._recent_bytes = 0
        #: shared by the gateway's LMQs (None: only this LMQ's own bound applies)
        self.budget = budget if budget is not None else RecentBudget(RECENT_BYTES)
        self.tail: int | None = None
        self.sub = SubscriptionData.build(lmq, "*")
        #: highest next-write offset seen (tail or a pull's max offset): readers' lag
        self.top = 0
        #: offset of the pull in flight (-1: none): readers of the same entries wait for
        #: it (they find them in `recent`) instead of pulling them again
        self.pulling = -1
        self.pull_waiters = False

    @property
    def recent_bytes(self) -> int:
        return self._recent_bytes

    @recent_bytes.setter
    def recent_bytes(self, value: int) -> None:
        self.budget.used += value - self._recent_bytes
        self._recent_bytes = value

    def remember(self, offset: int, msg: MqttMessage) -> None:
        recent = self.recent
        if offset not in recent:
            recent[offset] = msg
            self._admitted(len(msg.payload))

    def remember_run(self, first: int, msgs: list[MqttMessage]) -> None:
        """remember() for `msgs` at offsets first, first + 1, ... (one send's entries of
        this LMQ): the bounds are applied once, after all of them."""
        recent = self.recent
        if recent.keys().isdisjoint(range(first, first + len(msgs))):  # the usual case
            offset = first
            for msg in msgs:
                recent[offset] = msg
                offset += 1
            self._admitted(sum(map(len, map(_PAYLOAD, msgs))))
            return
        size = len(recent)  # a pull brought some already (a transport that yields)
        added = 0
        offset = first
        for msg in msgs:
            if offset not in recent:
                recent[offset] = msg
                added += len(msg.payload)
            offset += 1
        if len(recent) != size:
            self._admitted(added)

    def _admitted(self, added: int) -> None:
        """Entries holding `added` payload bytes just entered `recent`: account for them,
        then evict the oldest past this LMQ's bounds (one pass for a whole batch: under a
        flood every write evicts) and past the gateway's budget."""
        recent = self.recent
        budget = self.budget
        own = self._recent_bytes + added
        used = budget.used + added
        excess = len(recent) - RECENT_ENTRIES
        if excess > 0 or own > RECENT_BYTES:
            pop = recent.popitem
            gone = 0
            for _ in range(excess):
                gone += len(pop(False)[1].payload)
            own -= gone
            used -= gone
            while own > RECENT_BYTES and len(recent) > 1:
                gone = len(pop(False)[1].payload)
                own -= gone
                used -= gone
        self._recent_bytes = own
        budget.used = used
        order = budget.order
        try:
            order.move_to_end(self)
        except KeyError:
            order[self] = None
        if used > budget.limit:
            budget.trim(self)

    def forget_recent(self) -> None:
        """Drop the recent entries (a state released, a foreign writer found)."""
        self.recent.clear()
        self.recent_bytes = 0
        self.budget.order.pop(self, None)

    def pull_covers(self, offset: int, batch: int) -> bool:
        """Will the pull in flight bring the entry at `offset`? (The caller waits.)"""
        start = self.pulling
        if start >= 0 and start <= offset < start + batch:
            self.pull_waiters = True
            return True
        return False

    def learn_tail(self, max_offset: int, v0: int) -> None:
        """A read that began at version `v0` with nothing pending saw `max_offset`."""
        if self.version == v0 and not self.pending:
            self.tail = max_offset

    def completed(self, writes: int = 1, defer: list | None = None) -> None:
        """Writes to this LMQ finished: wake whoever reads it (or add them to `defer`)."""
        self.pending -= writes
        self.version += 1
        if defer is not None:
            defer.extend(self.watchers)
            return
        for w in self.watchers:
            w.wake()



async def pull_views(client: ClientInstance, addr: str, group: str, st: LmqState, offset: int,
                     batch: int, cache: dict, cache_size: int) -> PullResult:
    """PULL_MESSAGE of `st`'s LMQ, its records read as views (record_view.py) into
    MqttMessages: no MessageExt, no full decode; a message in `cache` (by broker and
    commitlog offset: an overlapping filter read it) is not parsed again. The result's
    `messages` are MqttMessages; records not written by a gateway are left out."""
    sub = st.sub
    ext = {
        "consumerGroup": group, "topic": st.lmq, "queueId": "0",
        "queueOffset": str(offset), "maxMsgNums": str(batch),
        "sysFlag": _PULL_FLAGS, "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subscription": sub.sub_string, "subVersion": str(sub.sub_version),
        "expressionType": sub.expression_type,
    }
    resp = await client.api.call(addr, RequestCode.PULL_MESSAGE, ext, ok=_PULL_CODES)
    status = _PULL_CODES[resp.code]
    msgs: list[MqttMessage] = []
    if status is PullStatus.FOUND and resp.body:
        broker = st.broker
        for view in iter_record_views(resp.body_bytes()):
            key = (broker, view.commitlog_offset)
            msg = cache.get(key)
            if msg is None:
                msg = from_record_view(view, broker)
                if msg is None:
                    continue  # not written by a gateway
                cache[key] = msg
                if len(cache) > cache_size:
                    del cache[next(iter(cache))]
            msgs.append(msg)
        if not msgs:
            status = PullStatus.NO_MATCHED_MSG
    return PullResult(status, resp.ext_int("nextBeginOffset", 0),
                      resp.ext_int("minOffset", 0), resp.ext_int("maxOffset", 0), msgs)
