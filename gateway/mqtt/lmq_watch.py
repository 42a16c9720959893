"""Watching and reading ahead an LMQ that other gateways write too (several gateways on
one cluster).

A gateway cannot predict the offsets of an LMQ others write (broker_link.py), so its
readers would not learn of those writes. One task per (broker, LMQ) that a connected
session reads does both the learning and most of the reading:

* At the end known so far it sends one long-polling PULL_MESSAGE of `pull_batch` entries
  (suspended up to `WATCH_SUSPEND_MS`). The entries it returns go into the state's recent
  entries (`LmqState.remember`) before the readers are woken, so a wake-up costs one
  round trip, not a second pull by the reader.
* While readers are behind (the LMQ's end is past what has been read ahead), it keeps up
  to `readahead_pulls` non-blocking pulls of `pull_batch` entries in flight ahead of the
  slowest reader: the broker answers at most `max_pull_msg_nums` entries per pull, so
  pipelined pulls, not bigger ones, are what keep a busy reader off the round-trip
  bound. Read-ahead stops while it is more than half the recent entries of one LMQ ahead
  of the slowest reader (`RECENT_ENTRIES` entries; `RECENT_BYTES` and half of the
  gateway's `max_recent_bytes` of payload, estimated from the entries held), so what is
  read ahead is not evicted before it is read; it then re-checks every
  `READAHEAD_RECHECK_S`. A reader whose entry the read-ahead missed (a failed or short
  pull, an evicted entry) pulls it itself, as before.

It ends when nobody reads the LMQ any more.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from core.client import PullResult, PullStatus
from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from core.remoting.errors import RemotingError
from core.store.record_view import iter_record_views
from gateway.mqtt.link_reads import DECODED_CACHE
from gateway.mqtt.lmq_state import RECENT_BYTES, RECENT_ENTRIES, LmqState
from gateway.mqtt.message import from_record_view

__all__ = ["READAHEAD_RECHECK_S", "WATCH_RETRY_S", "WATCH_SUSPEND_MS", "watch_lmq"]

log = logging.getLogger(__name__)

#: Suspension of a watch pull: it returns at once when the LMQ gets an entry, else after
#: this long and is sent again.
WATCH_SUSPEND_MS = 15_000
#: Pause after a failed watch pull.
WATCH_RETRY_S = 1.0
#: Answer time allowed on top of the suspension.
WATCH_MARGIN_S = 5.0
#: Answer time allowed for a read-ahead pull (not suspended).
READAHEAD_TIMEOUT_S = 5.0
#: While the read-ahead window is full, how often it looks whether readers moved on.
READAHEAD_RECHECK_S = 0.02
_SUSPEND_FLAGS = str(int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND))
_PLAIN_FLAGS = str(int(PullSysFlag.SUBSCRIPTION))
_WATCH_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
             ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED)


class _Ahead:
    """The read-ahead of one LMQ: next offset to ask for, pulls in flight."""

    __slots__ = ("link", "pos", "inflight", "changed", "starts", "polling")

    def __init__(self, link: Any, pos: int) -> None:
        self.link = link
        self.pos = pos
        #: offset of the long poll in flight at the end (-1: none)
        self.polling = -1
        #: offset ranges of the read-ahead pulls in flight
        self.starts: dict[int, int] = {}  # -> end
        self.inflight = 0
        self.changed = trio.Event()

    async def read(self, st: LmqState, offset: int, batch: int) -> PullResult | None:
        """A reader's pull from `offset`: if a read-ahead pull in flight brings that entry,
        wait for it and answer from the recent entries; None: pull it yourself. At or past
        the offset the long poll waits at, the answer is "nothing new": that poll brings
        the next entries and wakes the reader. Exactly where the read-ahead goes next,
        the reader sends that read-ahead pull itself (before the watch gets to it)."""
        if 0 <= self.polling <= offset:
            return PullResult(PullStatus.NO_NEW_MSG, offset, 0, st.top, [])
        while any(s <= offset < e for s, e in self.starts.items()):
            await self.changed.wait()
        recent = st.recent
        if offset not in recent and offset == self.pos < st.top and self.polling < 0 \
                and self.link._watched.get((st.broker, st.lmq)) is self:
            n = min(batch, st.top - offset)
            self.claim(st, offset, n)
            await _read_ahead(self.link, st, self, offset, n)
        msgs = []
        n = offset
        while n in recent and len(msgs) < batch:
            msgs.append(recent[n])
            n += 1
        if not msgs:
            return None
        return PullResult(PullStatus.FOUND, n, 0, max(st.top, n), msgs)

    def claim(self, st: LmqState, start: int, n: int) -> None:
        """Entries start .. start+n-1 are being read ahead (before the reading task
        yields: a reader woken meanwhile waits for it instead of pulling them too)."""
        self.pos = start + n
        self.inflight += 1
        self.starts[start] = start + n
        if st.pulling < 0:
            st.pulling = start

    def done(self) -> None:
        self.inflight -= 1
        self.changed.set()
        self.changed = trio.Event()


def _slowest(st: LmqState, key: tuple[str, str], default: int) -> int:
    """The lowest offset a reader of `st` still has to take from the recent entries."""
    low = None
    for w in st.watchers:
        cursors = getattr(w, "cursors", None)
        c = cursors.get(key) if cursors else None
        if c is not None and (low is None or c.next < low):
            low = c.next
    return default if low is None else low


def _room(st: LmqState, ahead: int) -> bool:
    """May the read-ahead go further, `ahead` entries past the slowest reader?"""
    if ahead >= RECENT_ENTRIES // 2:
        return False
    recent = st.recent
    if not recent or ahead <= 0:
        return True
    avg = st.recent_bytes / len(recent)
    return ahead * avg < min(RECENT_BYTES, st.budget.limit) // 2


async def _read(link: Any, st: LmqState, offset: int, batch: int,
                suspend: bool) -> tuple[int, int, int]:
    """One PULL_MESSAGE of `st`'s LMQ from `offset`; the entries written by gateways go to
    `st.recent`, the readers are woken. Returns (response code, next begin, max offset)."""
    ext = {"consumerGroup": link.config.pull_group, "topic": st.lmq, "queueId": "0",
           "queueOffset": str(offset), "maxMsgNums": str(batch), "commitOffset": "0",
           "sysFlag": _SUSPEND_FLAGS if suspend else _PLAIN_FLAGS,
           "suspendTimeoutMillis": str(WATCH_SUSPEND_MS if suspend else 0),
           "subscription": "*", "subVersion": "0", "expressionType": "TAG"}
    timeout = WATCH_SUSPEND_MS / 1000 + WATCH_MARGIN_S if suspend else READAHEAD_TIMEOUT_S
    stats = link.stats
    stats["readahead_pulls"] = stats.get("readahead_pulls", 0) + 1
    resp = await link.client.api.call(link.addr(st.broker), RequestCode.PULL_MESSAGE, ext,
                                      timeout=timeout, ok=_WATCH_OK)
    top = resp.ext_int("maxOffset", 0)
    found = False
    if resp.code == ResponseCode.SUCCESS and resp.body:
        cache = link._decoded
        broker, lmq = st.broker, st.lmq
        for view in iter_record_views(resp.body_bytes()):
            msg = cache.get((broker, view.commitlog_offset))
            if msg is None:
                msg = from_record_view(view, broker)
                if msg is None:
                    continue  # not written by a gateway: a reader pulls and skips it
                cache[(broker, view.commitlog_offset)] = msg
                if len(cache) > DECODED_CACHE:
                    del cache[next(iter(cache))]
            pos = msg.lmq_offsets.get(lmq)
            if pos is not None:
                st.remember(pos, msg)
                found = True
    if top > st.top:
        st.top = top
        found = True
    if found:
        # No version bump: a reader at the end stays known at the end (no pull of its own)
        # and reads from `recent` what lies below the raised `top`.
        for w in list(st.watchers):
            w.wake()
    return resp.code, resp.ext_int("nextBeginOffset", offset), top


def _wake(st: LmqState) -> None:
    """Readers re-check (and pull themselves): the version moves."""
    st.version += 1
    for w in list(st.watchers):
        w.wake()


async def _read_ahead(link: Any, st: LmqState, ahead: _Ahead, offset: int,
                      batch: int) -> None:
    starts = ahead.starts
    try:
        await _read(link, st, offset, batch, suspend=False)
    except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
        log.debug("read-ahead pull of %s@%s failed: %r", st.lmq, st.broker, exc)
    finally:
        starts.pop(offset, None)
        if st.pulling == offset:
            # the next pull in flight, if any, is the one readers wait for now
            st.pulling = min(starts) if starts else -1
            if st.pull_waiters:
                st.pull_waiters = False
                for w in list(st.watchers):
                    w.wake()
        ahead.done()


async def watch_lmq(link: Any, st: LmqState, watched: dict[tuple[str, str], Any]) -> None:
    """Long-poll `st`'s LMQ at its known end and read ahead of its readers while someone
    reads it (see the module doc)."""
    key = (st.broker, st.lmq)
    batch = link.config.pull_batch
    most = link.config.readahead_pulls
    ahead = watched[key] = _Ahead(link, st.top)
    try:
        async with trio.open_nursery() as nursery:
            while st.watchers and link.states.get(key) is st:
                slowest = _slowest(st, key, ahead.pos)
                if ahead.pos < slowest:
                    ahead.pos = slowest
                if most <= 0 and ahead.pos < st.top:
                    ahead.pos = st.top  # read-ahead off: only watch the end
                if ahead.pos >= st.top:
                    if ahead.inflight:
                        await ahead.changed.wait()
                        continue
                    start = ahead.polling = ahead.pos
                    try:
                        code, nxt, top = await _read(link, st, start, batch, suspend=True)
                    except (MQClientError, RemotingError, OSError, trio.TooSlowError) as exc:
                        log.debug("watch pull of %s@%s failed: %r", st.lmq, st.broker, exc)
                        ahead.polling = -1
                        _wake(st)  # readers told "nothing new" by `read` pull themselves
                        await trio.sleep(WATCH_RETRY_S)
                        continue
                    ahead.polling = -1
                    if code == ResponseCode.PULL_OFFSET_MOVED:
                        ahead.pos = nxt  # past the end (or below the minimum): from there
                        if nxt == start:
                            await trio.sleep(WATCH_RETRY_S)  # do not spin on it
                    elif code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
                        ahead.pos = max(start, nxt)
                    continue
                if most > 0 and ahead.inflight < most and _room(st, ahead.pos - slowest):
                    start = ahead.pos
                    n = min(batch, st.top - start)  # never past the end: no offset moved
                    ahead.claim(st, start, n)
                    nursery.start_soon(_read_ahead, link, st, ahead, start, n)
                    continue
                with trio.move_on_after(math.inf if ahead.inflight else READAHEAD_RECHECK_S):
                    await ahead.changed.wait()
            nursery.cancel_scope.cancel()
    finally:
        watched.pop(key, None)
        ahead.polling = -1
        _wake(st)
        ahead.changed.set()  # readers waiting in `read` pull themselves
