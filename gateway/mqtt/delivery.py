"""Delivery to one connected session: LMQ reads, the k-way merge, in-flight flow control.

One `Pump` task per connected session that has something to deliver (it starts with the
first subscription or on reconnect; an idle connection has none). A round:

1. *fill*: every cursor with an empty buffer reads its LMQ: first from the entries other
   sessions already read (`LmqState.recent`), else one non-blocking pull; a cursor that
   reached the end at the LMQ's current version waits for the next write (the dispatcher
   wakes it), it does not poll.
2. *merge*: per broker, the cursor heads are merged by commitlog offset. Every LMQ is
   ordered by commitlog offset, so equal heads are the same stored message: delivered
   once, at the highest QoS granted by the matching subscriptions (outbound QoS =
   min(published, granted)), with every subscription identifier. A cursor with an empty
   buffer holds the merge back only while its LMQ may still hold an older entry (a write
   in progress, or not read since the last write); a cursor at its end does not.
3. *send*: PUBLISH packets are encoded into the connection's output buffer and written
   in one `send_all`; QoS 1/2 deliveries stop at the in-flight limit (the client's
   Receive Maximum, bounded by `max_inflight_out`), everything stops while the output
   buffer is over `max_out_buffer`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import trio

from core.client import PullStatus
from gateway.mqtt.flow import writable
from gateway.mqtt.message import MqttMessage, now_ms
from gateway.mqtt.outbound import build_publish, encode_publish, merge_single_v3, retransmit
from gateway.mqtt.packets import PacketTooLarge
from gateway.mqtt.session import Cursor, Inflight, Session, Subscription
from gateway.mqtt.shared import SharedGroup

if TYPE_CHECKING:
    from gateway.mqtt.connection import Connection
    from gateway.mqtt.server import MqttGateway

__all__ = ["Pump", "build_publish", "encode_publish"]

log = logging.getLogger(__name__)

#: Pause after a failed pull before the cursor is read again.
PULL_RETRY_S = 1.0
#: Pull-and-deliver rounds a pump runs before it writes and yields to other tasks, and
#: the time they may take at most (the event loop stays responsive: PINGREQs, other
#: sessions).
TURN_BATCHES = 16
TURN_BUDGET_S = 0.005


class Pump:
    """The delivery task of one connected session (see the module doc)."""

    def __init__(self, gw: MqttGateway, session: Session, conn: Connection) -> None:
        self.gw = gw
        self.session = session
        self.conn = conn
        self._retry_at = 0.0
        #: held up by its client (a stuck write): publishers do not wait for it (flow.py)
        self.slow = False
        #: trio time it began waiting on its client: a socket write or acknowledgements
        #: (0.0: not waiting on the client)
        self.held_since = 0.0

    @property
    def client_id(self) -> str:
        return self.session.client_id

    def held_by_client(self) -> bool:
        """Waiting on the client, not on a busy event loop (flow.py): a socket write whose
        kernel buffer is full, or acknowledgements (the connection always reads them)."""
        if not self.held_since:
            return False
        if self.conn.out_bytes or getattr(self.conn, "_writing", False):
            return not writable(self.conn.stream)
        return True

    # -- main loop ---------------------------------------------------------------------

    async def run(self) -> None:
        sess = self.session
        conn = self.conn
        link = self.gw.link
        gate = link.gate
        for c in sess.cursors.values():
            # An offline session's state objects may have been released: look them up.
            st = link.state(c.st.broker, c.st.lmq)
            if st is not c.st:
                c.st = st
                c.end_version = -1
            st.watchers.add(sess)
        try:
            await self.retransmit()
            limit = self.gw.config.max_out_buffer
            woken = False
            while not conn.closed:
                if not woken:
                    await trio.lowlevel.checkpoint()  # fairness: a busy session yields
                # (just woken from a wait, it has yielded already: a lone message goes
                # out without one more pass of the scheduler)
                woken = False
                # In-process pulls do not yield: read and encode several batches per turn
                # (the publishers' tasks each handle a whole socket read per turn too).
                progress = False
                budget = trio.current_time() + TURN_BUDGET_S
                for _ in range(TURN_BATCHES):
                    await self.fill()
                    if not self.deliver():
                        break
                    progress = True
                    if conn.out_bytes >= limit or trio.current_time() >= budget:
                        break
                if conn.out:
                    self.held_since = trio.current_time()
                    try:
                        await conn.flush()
                    finally:
                        self.held_since = 0.0
                if conn.out_bytes > limit:
                    self.held_since = trio.current_time()
                    await conn.wait_drained()
                    self.held_since = 0.0
                    continue
                if self._needs_pull() or (progress and self._ready()):
                    gate.set_behind(self, self._behind())
                    continue
                # Waiting for acknowledgements is waiting for the client: publishers wait
                # with us only while it answers promptly (flow.STUCK_S).
                acks = len(sess.inflight) >= conn.inflight_limit
                gate.set_behind(self, acks and self._behind())
                if acks:
                    self.held_since = trio.current_time()
                # Session.wait returns at once (no yield) when woken meanwhile
                woken = not sess._woken
                with trio.move_on_at(self._next_retry()):
                    await sess.wait()
                self.held_since = 0.0
        finally:
            gate.set_behind(self, False)
            self.unwatch()

    def _ready(self) -> bool:
        """Something buffered could go out now (not held by the in-flight window)."""
        sess = self.session
        if len(sess.inflight) >= self.conn.inflight_limit:
            return False
        return any(c.buf for c in sess.cursors.values())

    def lag(self) -> int:
        """Messages stored for this session and not yet handed to its connection."""
        total = 0
        for c in self.session.cursors.values():
            st = c.st
            top = st.tail if st.tail is not None and st.tail > st.top else st.top
            if top > c.sent:
                total += top - c.sent
        return total

    def _behind(self) -> bool:
        """Should publishers wait for this session (see flow.py)?"""
        bound = self.gw.config.backpressure_lag
        lag = self.lag()
        if self.slow:
            if lag <= bound // 2:
                self.slow = False  # caught up: an ordinary subscriber again
            return False
        return lag > bound

    def _needs_pull(self) -> bool:
        now = trio.current_time()
        for c in self.session.cursors.values():
            st = c.st
            if (not c.buf and st.tail != c.next and c.retry_at <= now
                    and (c.next < st.top or not st.pending and c.end_version != st.version)
                    and not st.pull_covers(c.next, self.gw.config.pull_batch)):
                return True
        if now >= self._retry_at:
            for g in self.groups():
                if g.needs_pull():
                    return True
        return False

    def _next_retry(self) -> float:
        """When a failed pull is due again (inf if none failed)."""
        due = [c.retry_at for c in self.session.cursors.values() if c.retry_at]
        if self._retry_at:
            due.append(self._retry_at)
        now = trio.current_time()
        future = [t for t in due if t > now]
        return min(future) if future else float("inf")

    def groups(self) -> list[SharedGroup]:
        out = []
        groups = self.gw.groups
        for sub in self.session.subs.values():
            if sub.group is not None:
                g = groups.get(sub.lmq)
                if g is not None:
                    out.append(g)
        return out

    def watch(self, cursor: Cursor) -> None:
        cursor.st.watchers.add(self.session)

    def unwatch(self) -> None:
        link = self.gw.link
        for c in self.session.cursors.values():
            c.st.watchers.discard(self.session)
            c.buf.clear()
            c.next = c.sent
            c.end_version = -1
            link.release(c.st)

    # -- reading ---------------------------------------------------------------------------

    async def fill(self) -> None:
        link = self.gw.link
        batch = self.gw.config.pull_batch
        lag = self.gw.config.max_session_lag
        now = trio.current_time()
        if now >= self._retry_at:
            for g in self.groups():
                try:
                    await g.fill(link, batch)
                except Exception as exc:
                    log.debug("pull of shared group %s failed: %r", g.lmq, exc)
                    self._retry_at = trio.current_time() + PULL_RETRY_S
                    break
        brokers = link.brokers
        for c in list(self.session.cursors.values()):
            if c.sub.qos == 0:
                self._bound_qos0(c)
            if c.buf or c.retry_at > now:
                continue
            st = c.st
            if st.broker not in brokers:
                continue  # a broker that left the cluster: nothing to read there now
            if self.session not in st.watchers:
                live = link.states.get((st.broker, st.lmq))
                if live is not st:
                    # Released before this session watched it (a subscription added while
                    # another session left): a forgotten state never learns of writes,
                    # and a tail learnt on it would stay at the end for good.
                    st = c.st = link.state(st.broker, st.lmq)
                    c.end_version = -1
                st.watchers.add(self.session)
            if st.tail is not None and st.tail - c.next > lag:
                self._cut(c, st.tail - lag, "more than max_session_lag behind")
            if c.next in st.recent:
                self._take_recent(c, batch)
                continue
            if (st.pending or c.end_version == st.version) and c.next >= st.top:
                continue  # at the end, or a write on the way: the dispatcher wakes us
            if st.tail == c.next:
                c.end_version = st.version  # at the end, known without asking
                continue
            if st.pull_covers(c.next, batch):
                continue  # another session's read brings it: one read per filter
            v0 = st.version
            try:
                result = await link.pull(st, c.next)
            except Exception as exc:
                # Only this cursor waits: the other brokers' LMQs keep flowing.
                log.debug("pull of %s@%s failed: %r", st.lmq, st.broker, exc)
                c.retry_at = trio.current_time() + PULL_RETRY_S
                continue
            c.retry_at = 0.0
            if self.session.cursors.get((st.broker, st.lmq)) is not c:
                continue  # unsubscribed meanwhile
            status = result.status
            if status is PullStatus.FOUND:
                if result.max_offset - c.next > lag:
                    self._cut(c, result.max_offset - lag, "more than max_session_lag behind")
                    continue
                lmq = st.lmq
                buf = c.buf
                match = c.match
                for msg in result.messages:
                    pos = msg.lmq_offsets.get(lmq)
                    if pos is not None and pos >= c.next:
                        if match(msg.topic):
                            buf.append((pos, msg))
                        else:
                            self._mismatch(c, pos, msg)
                c.next = max(c.next, result.next_begin_offset)
                if result.next_begin_offset >= result.max_offset:
                    c.end_version = v0
                if not buf:
                    c.sent = max(c.sent, c.next)  # all skipped (foreign records)
            elif status is PullStatus.NO_NEW_MSG:
                c.end_version = v0
            elif status is PullStatus.NO_MATCHED_MSG:
                c.next = max(c.next, result.next_begin_offset)
                c.sent = max(c.sent, c.next)
            else:  # OFFSET_ILLEGAL: retention moved the minimum, or the LMQ is gone
                self._cut(c, result.next_begin_offset, "offset no longer in the LMQ")

    def _bound_qos0(self, c: Cursor) -> None:
        """A QoS 0 cursor more than max_queued_messages behind drops its oldest."""
        queued = self.gw.config.max_queued_messages
        st = c.st
        top = st.tail if st.tail is not None and st.tail > st.top else st.top
        if top - c.sent > queued:
            self._drop_qos0(c, top - queued)
        elif c.dropped >= 0 and top - c.sent <= queued // 2:
            log.info("session %r: delivery of %r caught up after dropping %d QoS 0 "
                     "message(s)", self.session.client_id, c.sub.filter, c.dropped)
            c.dropped = -1

    def _take_recent(self, c: Cursor, batch: int) -> None:
        """Buffer the cursor's next entries from its LMQ's recent ones (no pull)."""
        recent = c.st.recent
        n = c.next
        buf = c.buf
        match = c.match
        ok = None  # a topic matched (publishers repeat theirs: tested once a run)
        while n in recent and len(buf) < batch:
            msg = recent[n]
            if msg.topic is ok or match(msg.topic):
                ok = msg.topic
                buf.append((n, msg))
            else:
                self._mismatch(c, n, msg)
            n += 1
        c.next = n
        if not buf:
            c.sent = max(c.sent, n)

    # -- delivering in the caller's task ------------------------------------------------

    def deliver_now(self) -> bool:
        """One turn of `run` done by the caller (a publisher's reader that has just stored
        a message, the reader of this client's PUBACKs), without waking this task: only
        while the pump sleeps with nothing of its own to do, every cursor's next entries
        are in the recent ones or known absent (no pull), no shared subscription, and the
        kernel takes the whole write. True when done; False: the caller wakes the pump,
        which finds the state as the pump itself would have left it."""
        sess = self.session
        conn = self.conn
        if (sess._wake is None or sess._woken or self.held_since or self.slow or conn.out
                or conn.closed or conn._writing or not conn.writes_direct):
            return False
        batch = self.gw.config.pull_batch
        lag = self.gw.config.max_session_lag
        now = trio.current_time()
        for sub in sess.subs.values():
            if sub.group is not None:
                return False
        for c in sess.cursors.values():
            if c.sub.qos == 0:
                self._bound_qos0(c)
            if c.buf or c.retry_at > now:
                continue
            st = c.st
            if sess not in st.watchers or (st.tail is not None and st.tail - c.next > lag):
                return False
            if c.next in st.recent:
                self._take_recent(c, batch)
            elif not ((st.pending or c.end_version == st.version) and c.next >= st.top):
                if st.tail != c.next:
                    return False  # a pull: the pump's
                c.end_version = st.version
        if self.deliver() and not conn.write_now():
            return False  # the pump writes the rest
        if self._ready() or self._needs_pull() or len(sess.inflight) >= conn.inflight_limit:
            return False
        return True

    def _mismatch(self, c: Cursor, offset: int, msg: MqttMessage) -> None:
        """An LMQ entry whose topic does not match the filter it is read for (a foreign
        writer, a name collision): not delivered; counted, logged once per cursor."""
        c.mismatched += 1
        self.gw.link.stats["topic_mismatch"] += 1
        if c.mismatched == 1:
            log.warning("session %r: %s@%s offset %d holds topic %r, which filter %r does "
                        "not match; skipped", self.session.client_id, c.st.lmq, c.st.broker,
                        offset, msg.topic[:200], c.sub.filter)

    def _drop_qos0(self, c: Cursor, offset: int) -> None:
        """A QoS 0 subscription more than max_queued_messages behind skips to the newest:
        the per-client bound of a slow client (Mosquitto's max_queued_messages), counted in
        $SYS/broker/messages/dropped, logged once per episode (not per message)."""
        skipped = offset - c.sent
        if c.dropped < 0:
            c.dropped = 0
            log.warning("session %r: delivery of %r is more than max_queued_messages (%d) "
                        "behind; dropping its oldest QoS 0 messages", self.session.client_id,
                        c.sub.filter, self.gw.config.max_queued_messages)
        c.dropped += skipped
        c.reset_to(offset)
        self.session.dirty = True
        self.gw.stats.dropped += skipped

    def _cut(self, c: Cursor, offset: int, why: str) -> None:
        """Skip a cursor forward: the documented bound of offline messages.

        One log line per cursor and connection, the skipped count in
        `$SYS/broker/messages/dropped`, and a notice the client can subscribe to:
        `$SYS/broker/clients/<client id>/skipped` (JSON: filter, from, to, count).
        """
        skipped = max(0, offset - c.next)
        if not c.gap_logged:
            c.gap_logged = True
            log.warning("session %r skips %d message(s) of %r (%s@%s %d..%d): %s",
                        self.session.client_id, skipped, c.sub.filter, c.st.lmq, c.st.broker,
                        c.next, offset, why)
        cid = self.session.client_id
        if skipped and "+" not in cid and "#" not in cid:
            notice = json.dumps({"filter": c.sub.filter, "from": c.next, "to": offset,
                                 "count": skipped, "reason": why})
            self.gw.publish_internal(MqttMessage(
                f"$SYS/broker/clients/{cid}/skipped", notice.encode(), 0, False))
        c.reset_to(offset)
        self.session.dirty = True
        self.gw.stats.dropped += skipped
        self.gw.stats.dropped_lag += skipped

    # -- merging and sending -------------------------------------------------------------

    def deliver(self) -> int:
        """Encode what may go out now into the output buffer; returns packets queued."""
        sess = self.session
        conn = self.conn
        limit = self.gw.config.max_out_buffer
        sent = 0
        now = now_ms()
        # Direct deliveries (retained on subscribe, shared subscriptions) go first.
        for sub in sess.subs.values():
            if sub.group is not None:
                sent += self._take_shared(sub, now, limit)
        direct = sess.direct
        while direct and conn.out_bytes < limit:
            msg, qos, retain, sub_ids, group = direct[0]
            if qos and len(sess.inflight) >= conn.inflight_limit:
                break
            direct.popleft()
            sent += self._send(msg, qos, retain, sub_ids, [], group, now)
        if not sess.cursors:
            return sent
        by_broker: dict[str, list[Cursor]] = {}
        for c in sess.cursors.values():
            by_broker.setdefault(c.st.broker, []).append(c)
        for cursors in by_broker.values():
            sent += self._merge(cursors, now, limit)
        return sent

    def _take_shared(self, sub: Subscription, now: int, limit: int) -> int:
        g = self.gw.groups.get(sub.lmq)
        if g is None:
            return 0
        sess = self.session
        conn = self.conn
        sent = 0
        sub_ids = (sub.sub_id,) if sub.sub_id is not None else ()
        while conn.out_bytes < limit:
            if sub.qos and len(sess.inflight) >= conn.inflight_limit:
                break
            item = g.take(sess)
            if item is None:
                break
            msg, broker, offset = item
            if msg.expired(now):
                g.ack(broker, offset)
                continue
            retain = msg.retain if sub.retain_as_published else False
            sent += self._send(msg, min(msg.qos, sub.qos), retain, sub_ids, [],
                               (g, broker, offset), now)
        return sent

    def _merge(self, cursors: list[Cursor], now: int, limit: int) -> int:
        sess = self.session
        conn = self.conn
        client_id = sess.client_id
        sent = 0
        single = cursors[0] if len(cursors) == 1 else None
        if single is not None and single.sub.qos < 2 and not single.sub.no_local \
                and not conn.acl_checked and conn.version != 5 \
                and conn.codec.peer_max_packet_size is None:
            return merge_single_v3(self.session, self.conn, self.gw.stats, single, now, limit)
        while conn.out_bytes < limit:
            if single is not None:
                if not single.buf:
                    return sent
                heads = [single]
                msg = single.buf[0][1]
            else:
                best = None
                empty = None
                for c in cursors:
                    if c.buf:
                        clog = c.buf[0][1].commitlog_offset
                        if best is None or clog < best:
                            best = clog
                    elif not c.caught_up():
                        if empty is None:
                            empty = []
                        empty.append(c)
                if best is None:
                    return sent
                if empty is not None and not self._none_older(empty, best):
                    return sent  # an older entry may still come from one of these LMQs
                heads = [c for c in cursors if c.buf and c.buf[0][1].commitlog_offset == best]
                msg = heads[0].buf[0][1]
            qos = -1
            retain = False
            sub_ids: list[int] = []
            own = msg.sender is not None and msg.sender == client_id
            for c in heads:
                sub = c.sub
                if own and sub.no_local:
                    continue
                if sub.qos > qos:
                    qos = sub.qos
                if sub.retain_as_published:
                    retain = msg.retain
                if sub.sub_id is not None:
                    sub_ids.append(sub.sub_id)
            if qos > msg.qos:
                qos = msg.qos
            if qos > 0 and len(sess.inflight) >= conn.inflight_limit:
                return sent  # wait for an acknowledgement; order is kept
            refs = []
            for c in heads:
                offset, _ = c.buf.popleft()
                c.sent = offset + 1
                refs.append((c, offset))
            sess.dirty = True
            if qos < 0 or msg.expired(now):
                continue  # no-local only, or expired (MQTT-3.3.2-5): consumed unsent
            sent += self._send(msg, qos, retain, tuple(sub_ids), refs, None, now)
        return sent

    def _none_older(self, cursors: list[Cursor], clog: int) -> bool:
        """Can none of these drained cursors still get an entry older than commitlog
        offset `clog`? True when each has read up to its known tail and every write
        below `clog` is accounted for in the tails (BrokerLink.advanced). Writes in
        progress come after it in the CommitLog: they do not hold the merge back (under
        steady load some always are, and a session of several filters would stall)."""
        link = self.gw.link
        for c in cursors:
            st = c.st
            if st.tail is None or c.next < st.tail or clog > link.advanced.get(st.broker, -1):
                return False
        return True

    def _send(self, msg: MqttMessage, qos: int, retain: bool, sub_ids: tuple[int, ...],
              refs: list, group: object, now: int) -> int:
        sess = self.session
        conn = self.conn
        # ACL read check (auth.py): only while a granted filter overlaps a deny rule.
        if conn.acl_checked and not conn.may_read(msg.topic):
            if group is not None:
                group[0].ack(group[1], group[2])
            return 0  # consumed unsent, as an expired message
        pid = None
        entry = None
        if qos:
            pid = sess.next_packet_id()
            entry = Inflight(pid, qos, msg, refs, retain, sub_ids)
            entry.group = group
            for c, offset in refs:
                c.unacked.add(offset)
        try:
            data = encode_publish(conn, msg, qos, retain, sub_ids, pid, False, now)
        except PacketTooLarge:
            # MQTT-3.1.2-25: discard as if sent (the client could not take it).
            if entry is not None:
                sess.release(entry)
            elif group is not None:
                g, broker, offset = group
                g.ack(broker, offset)
            self.gw.stats.dropped += 1
            self.gw.stats.dropped_too_large += 1
            return 0
        if entry is not None:
            sess.inflight[pid] = entry
        elif group is not None:
            g, broker, offset = group
            g.ack(broker, offset)
        conn.queue(data)
        stats = self.gw.stats
        stats.msgs_out += 1
        stats.bytes_out += len(data)
        return 1

    # -- after a reconnect ------------------------------------------------------------------

    async def retransmit(self) -> None:
        """Resend every unacknowledged PUBLISH (DUP=1) and PUBREL, in order (§4.4)."""
        await retransmit(self.gw, self.session, self.conn)
