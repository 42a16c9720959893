"""The broker link's reads (a mixin of `BrokerLink`, broker_link.py): LMQ pulls that keep
the LMQ states' recent entries and learn their tails, lookups of offsets, and stored
messages read back by commitlog offset (decoded once, kept in a bounded cache shared by
the filters that read them)."""

from __future__ import annotations

import logging
from typing import Any

from core.client import PullResult, PullStatus
from gateway.mqtt.lmq_state import LmqState, pull_views
from gateway.mqtt.message import MqttMessage, from_message_ext

__all__ = ["DECODED_CACHE", "DECODED_CACHE_BYTES", "LinkReads"]

log = logging.getLogger(__name__)

#: Decoded messages kept by (broker, commitlog offset): overlapping filters share them.
DECODED_CACHE = 4096
DECODED_CACHE_BYTES = 8 * 1024 * 1024


class LinkReads:
    """Reads of `BrokerLink` (whose attributes they use: client, config, states'
    bookkeeping, `_decoded`, `_watched`, the send counters)."""

    def decode(self, ext: Any, broker: str) -> MqttMessage | None:
        key = (broker, ext.commitlog_offset)
        msg = self._decoded.get(key)
        if msg is None:
            msg = from_message_ext(ext, broker)
            if msg is None:
                return None
            cache = self._decoded
            cache[key] = msg
            if len(cache) > DECODED_CACHE:
                del cache[next(iter(cache))]
        return msg

    async def pull(self, st: LmqState, offset: int) -> PullResult:
        """One non-blocking pull of `st`'s LMQ from `offset` (entries go to `st.recent`);
        `messages` of the result are MqttMessages (records of other writers left out)."""
        ahead = self._watched.get((st.broker, st.lmq)) if self.foreign_writers else None
        if ahead is not None:
            got = await ahead.read(st, offset, self.config.pull_batch)
            if got is not None:
                return got  # the read-ahead in flight brought it: no second pull
        v0 = st.version if not st.pending else -1
        # With no send on the wire before and after, every stored write already went
        # through _advance_tails: the max offset seen is the tail, writes pending or not
        # (under steady load some always are, and the tail would never be learnt).
        quiet = -1 if self._sending else self._sent_chunks
        st.pulling = offset
        try:
            self.stats["pulls"] += 1
            result = await pull_views(self.client, self.addr(st.broker), self.config.pull_group,
                                      st, offset, self.config.pull_batch, self._decoded,
                                      DECODED_CACHE)
        finally:
            st.pulling = -1
            if st.pull_waiters:
                st.pull_waiters = False
                for w in st.watchers:
                    w.wake()
        if result.status is PullStatus.FOUND:
            lmq = st.lmq
            for msg in result.messages:
                pos = msg.lmq_offsets.get(lmq)
                if pos is not None:
                    known = st.recent.get(pos)
                    if known is not None and known.commitlog_offset != msg.commitlog_offset:
                        # Someone else writes this LMQ: stop predicting its offsets.
                        log.warning("LMQ %s@%s has a foreign writer; reading it by pulls",
                                    lmq, st.broker)
                        st.forget_recent()
                        st.tail = None
                    st.remember(pos, msg)
        if result.status is not PullStatus.OFFSET_ILLEGAL:
            if result.max_offset > st.top:
                st.top = result.max_offset
            if self.foreign_writers:
                if st.watchers:
                    self._watch(st)
            elif quiet >= 0 and not self._sending and self._sent_chunks == quiet \
                    and st.tail is None:
                st.tail = result.max_offset
            elif st.tail is None:
                st.learn_tail(result.max_offset, v0)  # wherever we read, max is the next write
        return result

    async def max_offset(self, broker: str, lmq: str) -> int:
        return await self.client.api.get_max_offset(self.addr(broker), lmq, 0)

    async def min_offset(self, broker: str, lmq: str) -> int:
        return await self.client.api.get_min_offset(self.addr(broker), lmq, 0)

    async def view(self, broker: str, commitlog_offset: int) -> MqttMessage | None:
        """The stored message at `commitlog_offset` (retransmission after a restart)."""
        key = (broker, commitlog_offset)
        msg = self._decoded.get(key)
        if msg is not None:
            return msg
        ext = await self.client.api.view_message(self.addr(broker), commitlog_offset)
        return self.decode(ext, broker)
