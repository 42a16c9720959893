"""`SessionRegistry`: every session of the gateway, the live-filter trie, persistence.

* Sessions by client id, online or not; a persistent session (3.1.1 clean session 0, v5
  Session Expiry Interval > 0) stays, with its subscriptions live in the trie, until it
  expires, so its LMQs keep receiving while it is offline.
* Routes: every subscription holds a route of the shared routing table
  (`gateway/routing`, `MqttGateway.routes`): filter -> LMQ, owned by the session. A
  SUBSCRIBE adds it and is answered once every live gateway applied it (or after the
  route log's bounded wait); UNSUBSCRIBE and the end of a session (clean session closed,
  expiry) remove it; a persistent session's routes stay when the gateway stops or dies,
  so its LMQs keep receiving. Every gateway routes publishes by that table.
  `$share/<g>/<f>` routes `<f>` to the shared subscription's own LMQ. The local trie
  keeps this gateway's live filters (reference-counted per subscription).
* Persistence (`SessionStore`): the session record is written when it changes
  structurally; offsets, in-flight and QoS 2 state are written behind by `flush()`.
* Session takeover (MQTT-3.1.4-3): a CONNECT for a client id that is connected closes the
  older connection (v5: DISCONNECT 0x8E) and waits for it to wind down first.
* Persistent sessions are counted (`stored`); a CONNECT that would create one more than
  `max_stored_sessions` raises `SessionQuotaExceeded` (the connection refuses it).
* Will messages: published at once on an abnormal close, or after the Will Delay
  Interval, or when the session ends, whichever comes first (v5 §3.1.3.2.2).
"""

from __future__ import annotations

import hashlib
import logging
from functools import partial
from typing import TYPE_CHECKING

import trio

from gateway.mqtt.logtext import shown
from gateway.mqtt.message import MqttMessage, now_ms
from gateway.mqtt.packets import Will
from gateway.mqtt.session import Cursor, Session, Subscription, restore_state
from gateway.mqtt.shared import SharedGroup
from gateway.mqtt.sweep import sweep
from gateway.mqtt.topics import parse_shared_subscription
from gateway.routing import lmq_names
from gateway.routing.route_table import MAX_PATTERN_BYTES, MQTT_ROUTE_READERS, Route
from gateway.routing.topic_trie import TopicTrie

if TYPE_CHECKING:
    from gateway.mqtt.server import MqttGateway

__all__ = ["SessionQuotaExceeded", "SessionRegistry"]

log = logging.getLogger(__name__)


def route_owner(client_id: str, gateway_id: str | None) -> str:
    """Owner of a session's routes: `p:<client id>` for a persistent session (its routes
    outlive the gateway and move with the session), `c:<gateway id>:<client id>` for a
    clean session (a late remove from a gateway that lost the client then cannot drop the
    route the client's new session on another gateway added, and a restarted gateway can
    find the routes its lost clean sessions left). Long client ids are hashed."""
    cid = client_id
    if len(cid.encode("utf-8", "surrogatepass")) > MAX_PATTERN_BYTES // 2:
        cid = "sha256:" + hashlib.sha256(cid.encode("utf-8", "surrogatepass")).hexdigest()
    return "p:" + cid if gateway_id is None else f"c:{gateway_id}:{cid}"


#: Longest a persistent session's SUBSCRIBE waits for its record to be stored in the
#: cluster (several gateways; the write goes on after it).
CLUSTER_WRITE_WAIT_S = 3.0
_NO_STATE = hash(((), ()))  # nothing in flight, no inbound QoS 2 id


class SessionQuotaExceeded(Exception):
    """A new persistent session would exceed `max_stored_sessions`."""


class SessionRegistry:
    """Sessions, live filters and their persistence for one gateway."""

    def __init__(self, gw: MqttGateway) -> None:
        self.gw = gw
        self.sessions: dict[str, Session] = {}
        self.trie: TopicTrie[str] = TopicTrie()
        self.groups: dict[str, SharedGroup] = {}
        self._group_offsets: dict[str, int] = {}
        self.subscription_count = 0
        #: client ids of persistent sessions (max_stored_sessions counts these)
        self.stored: set[str] = set()
        #: client id -> offset of its connection's record in the client registry
        #: (ClientLog), None while the record is being written
        self._announced: dict[str, int | None] = {}
        self._seen_while_announcing: dict[str, tuple[int, bool]] = {}
        #: client ids taken over by another gateway -> whether with clean start there
        #: (the session ends here) or not (it continues there: forgotten here, its
        #: routes left in place)
        self._moved: dict[str, bool] = {}
        self._expiring: set[str] = set()
        #: client id -> positions last written to the cluster
        self._posted: dict[str, dict[tuple[str, str], int]] = {}
        #: client id -> signature of the in-flight state last posted to the cluster
        self._state_sig: dict[str, int] = {}

    def route(self, topic: str) -> tuple[str, ...]:
        """LMQs of every live filter matching `topic`, sorted (the dispatcher's router)."""
        return self.trie.match_sorted(topic)

    # -- start-up ---------------------------------------------------------------------------

    def load(self) -> int:
        """Rebuild persisted sessions (offline) and their live filters after a restart."""
        store = self.gw.store
        self._group_offsets = store.load_group_offsets()
        now_wall = now_ms()
        now = trio.current_time()
        cap = self.gw.config.max_session_expiry_s
        for client_id, record in list(store.load_sessions()):
            expiry = record.get("exp")
            if cap is not None and (expiry is None or expiry > cap):
                expiry = cap  # stored under a larger (or no) max_session_expiry_s
            sess = Session(client_id, record.get("v", 4), expiry)
            gone = record.get("gone") or now_wall
            sess.gone_ms = gone
            sess.gone_at = now - max(0.0, (now_wall - gone) / 1000)
            offsets, inflight, qos2 = store.load_state(client_id)
            for raw in record.get("subs", []):
                f, qos, nl, rap, rh, sid, lmq = raw
                sub = Subscription(f, qos, nl, rap, rh, sid, lmq)
                shared = parse_shared_subscription(f)
                sub.route = Route("mqtt", shared.filter if shared is not None else f, lmq,
                                  owner=route_owner(client_id, None))
                self._attach(sess, sub, offsets, None)
            restore_state(sess, offsets, inflight, qos2, self.gw.retained.get)
            self.sessions[client_id] = sess
            self.stored.add(client_id)
        return len(self.sessions)

    def restore_routes(self) -> int:
        """Add the routes of restored sessions that the shared table lacks (a new cluster,
        or the table was cut), remove those of this gateway's former clean sessions; not
        waited for. The number posted."""
        routes = self.gw.routes
        posted = 0
        cs = self.gw.cluster_sessions
        if cs is not None and not routes.sweepers:  # sessions whose gateway vanished
            routes.sweepers.append(partial(cs.sweep_sessions, routes))
            cs.on_will = lambda cid, will: self.publish_will(Session(cid, 5, 0), will)
        # Clean sessions do not survive a restart: routes they left (the gateway stopped
        # before removing them, or died) go now.
        mine = f"c:{self.gw.gateway_id}:"
        for route in [r for r in routes.table.routes()
                      if r.kind == "mqtt" and r.owner.startswith(mine)]:
            routes.post("remove", route)
            posted += 1
        for sess in self.sessions.values():
            for sub in sess.subs.values():
                if sub.route is not None and sub.route not in routes.table:
                    routes.post("add", sub.route)
                    posted += 1
        if posted:
            log.info("MQTT: %d route(s) of restored / former sessions re-added or removed",
                     posted)
        return posted

    # -- connect / disconnect ------------------------------------------------------------------

    def cluster(self):
        """The sessions kept in the cluster (ClusterSessions), while other MQTT gateways
        may exist (alone, nobody else could resume a session)."""
        cs = self.gw.cluster_sessions
        return cs if cs is not None and self.gw.link.foreign_writers else None

    async def open(self, conn, client_id: str, version: int, clean_start: bool,
                   expiry: int | None, will: Will | None) -> tuple[Session, bool]:
        """Attach `conn` to a new or resumed session; returns (session, session present)."""
        cs = self.cluster()
        if cs is not None and not clean_start:
            await cs.adopt(self, client_id)
        elif cs is not None and client_id not in self.stored:
            try:  # clean start discards a session another gateway may have recorded
                stored = await cs.fetch(client_id)
            except Exception as exc:
                log.warning("session %s not read from the cluster: %r", shown(client_id), exc)
                stored = None
            if stored is not None and stored.record is not None:
                cs.post_delete(client_id)
        old = self.sessions.get(client_id)
        # Loop: another CONNECT with this id may have waited on the same kick and attached
        # first; it is taken over in turn, so one connection holds the id (MQTT-3.1.4-3).
        while old is not None and old.conn is not None:
            await old.conn.kick(0x8E)  # Session taken over
            old = self.sessions.get(client_id)
        if old is not None and (clean_start or old.ended):
            self.end(old)
            old = None
        if old is None:
            if expiry != 0 and len(self.stored) >= self.gw.config.max_stored_sessions:
                raise SessionQuotaExceeded(client_id)
            sess = Session(client_id, version, expiry)
            self.sessions[client_id] = sess
            present = False
        else:
            sess = old
            present = True
            sess.version = version
            sess.expiry = expiry
            if sess.will is not None and sess.will_due is not None:
                sess.will = None  # reconnected within the Will Delay Interval: not sent
        sess.conn = conn
        sess.will = will
        sess.will_due = None
        sess.gone_at = None
        sess.gone_ms = None
        if sess.persistent:
            self.stored.add(client_id)
            self.gw.store.put_session(client_id, sess.record())
            if cs is not None:
                cs.post_record(sess)  # the session is this gateway's now
        elif present:
            self.gw.store.delete_session(client_id)
        for sub in sess.subs.values():
            if sub.group is not None:
                g = self.groups.get(sub.lmq)
                if g is not None:
                    g.join(sess, self.gw.link)
        self._moved.pop(client_id, None)
        await self._announce(sess, conn, clean_start)
        return sess, present

    async def _announce(self, sess: Session, conn, clean_start: bool) -> None:
        """Record the connection in the cluster's client registry (only with other MQTT
        gateways around: alone, nobody can take a client over)."""
        clients = self.gw.clients
        client_id = sess.client_id
        if clients is None or not self.gw.link.foreign_writers:
            self._announced.pop(client_id, None)
            return
        self._announced[client_id] = None
        try:
            offset = await clients.announce(client_id, clean_start)
        except Exception as exc:
            log.warning("client %s not recorded in the client registry: %r",
                        shown(client_id), exc)
            offset = -1
        if sess.conn is not conn:
            return  # taken over locally meanwhile: that connection's record counts
        self._announced[client_id] = offset
        later = self._seen_while_announcing.pop(client_id, None)
        if later is not None and later[0] > offset:
            self.taken_elsewhere(client_id, *later)

    def taken_elsewhere(self, client_id: str, offset: int, clean_start: bool) -> None:
        """Another gateway recorded a connection of `client_id` at `offset` in the client
        registry: if that is after this gateway's connection, close it (0x8E).

        With clean start there, the session here ends as a local clean start would end it
        (its routes removed); without, it continues there: forgotten here, routes kept."""
        sess = self.sessions.get(client_id)
        if sess is None or sess.conn is None:
            return
        mine = self._announced.get(client_id, -1)
        if mine is None:  # our record is being written: decide once its offset is known
            seen = self._seen_while_announcing
            if offset > seen.get(client_id, (-1, True))[0]:
                seen[client_id] = (offset, clean_start)
            return
        if offset > mine:
            log.info("client %s connected on another gateway: session taken over",
                     shown(client_id))
            self._announced.pop(client_id, None)
            self._moved[client_id] = clean_start
            sess.conn.close(0x8E)  # Session taken over

    def closed(self, sess: Session, conn, *, send_will: bool) -> None:
        """`conn` (the session's connection) has ended."""
        if sess.conn is not conn:
            return
        sess.conn = None
        for sub in sess.subs.values():
            if sub.group is not None:
                g = self.groups.get(sub.lmq)
                if g is not None:
                    g.leave(sess, self.gw.link)
        now = trio.current_time()
        sess.gone_at = now
        sess.gone_ms = now_ms()
        will = sess.will if send_will else None
        if not send_will:
            sess.will = None
        clean_elsewhere = self._moved.pop(sess.client_id, None)
        if clean_elsewhere is not None:
            if clean_elsewhere:
                if will is not None:
                    self.publish_will(sess, will)
                self.end(sess)
            else:
                # The session continues on the gateway that took the client over: its
                # will, its routes and its record are that gateway's business now.
                self.forget(sess)
            return
        if not sess.persistent:
            if will is not None:
                self.publish_will(sess, will)
            self.end(sess)
            return
        if will is not None:
            delay = will.properties.will_delay_interval or 0
            if sess.expiry is not None:
                delay = min(delay, sess.expiry)
            if delay <= 0:
                self.publish_will(sess, will)
            else:
                sess.will_due = now + delay
        self.gw.store.put_session(sess.client_id, sess.record())
        self.persist(sess)
        cs = self.cluster()
        if cs is not None:
            cs.post_record(sess, state=True)

    def publish_will(self, sess: Session, will: Will) -> None:
        sess.will = None
        sess.will_due = None
        p = will.properties
        expiry_at = None
        if p.message_expiry_interval is not None:
            expiry_at = now_ms() + p.message_expiry_interval * 1000
        from dataclasses import replace

        props = replace(p, will_delay_interval=None, message_expiry_interval=None)
        if props == type(props)():
            from gateway.mqtt.packets import NO_PROPERTIES

            props = NO_PROPERTIES
        msg = MqttMessage(will.topic, will.payload, will.qos, will.retain, props, expiry_at,
                          sess.client_id)
        self.gw.publish_internal(msg, sess.client_id)

    def forget(self, sess: Session) -> None:
        """Drop this gateway's copy of a session that continues on another gateway: no
        will, routes and cluster record left in place."""
        sess.will = None
        for sub in sess.subs.values():
            sub.route = None
        self.end(sess, elsewhere=True)

    def end(self, sess: Session, *, elsewhere: bool = False) -> None:
        """The session is over: forget it, its subscriptions and its stored state."""
        cs = self.cluster()
        if cs is not None and not elsewhere and sess.client_id in self.stored \
                and self.sessions.get(sess.client_id) is sess:
            cs.post_delete(sess.client_id)
        sess.ended = True
        self._posted.pop(sess.client_id, None)
        self._state_sig.pop(sess.client_id, None)
        if sess.will is not None and sess.will_due is not None:
            self.publish_will(sess, sess.will)  # will delay cut short (v5 §3.1.3.2.2)
        for f in list(sess.subs):
            self.unsubscribe(sess, f)
        sess.inflight.clear()
        if self.sessions.get(sess.client_id) is sess:
            del self.sessions[sess.client_id]
            self.stored.discard(sess.client_id)
            self.gw.store.delete_session(sess.client_id)

    async def tick(self) -> None:
        """Expire offline sessions and send due wills (called every second or so), a
        slice of the sessions per step of the event loop (sweep.py)."""
        await sweep(self.sessions.values(), partial(self._tick_one, trio.current_time()))

    def _tick_one(self, now: float, sess: Session) -> None:
        if sess.conn is not None or sess.gone_at is None:
            return
        if self.sessions.get(sess.client_id) is not sess:
            return  # ended or replaced since the pass began
        if sess.will is not None and sess.will_due is not None and now >= sess.will_due:
            self.publish_will(sess, sess.will)
            cs = self.cluster()
            if cs is not None and sess.persistent:
                cs.post_record(sess, state=True)  # sent: no other gateway sends it
        if sess.expiry is not None and now >= sess.gone_at + sess.expiry:
            cs = self.cluster()
            if cs is not None and self.gw.nursery is not None:
                if sess.client_id not in self._expiring:
                    self._expiring.add(sess.client_id)
                    self.gw.nursery.start_soon(self._expire_checked, cs, sess)
                return
            log.info("session %s expired", shown(sess.client_id))
            self.end(sess)

    async def _expire_checked(self, cs, sess: Session) -> None:
        """Expire `sess` unless another gateway recorded it later (it moved there)."""
        try:
            stored = await cs.fetch(sess.client_id)
        except Exception as exc:
            log.warning("session %s not read from the cluster: %r", shown(sess.client_id), exc)
            stored = None
        finally:
            self._expiring.discard(sess.client_id)
        if self.sessions.get(sess.client_id) is not sess or sess.conn is not None:
            return
        if stored is not None and stored.gateway != self.gw.gateway_id \
                and stored.stamp > sess.cluster_stamp:
            log.info("session %s continues on gateway %s: copy dropped",
                     shown(sess.client_id), stored.gateway)
            self.forget(sess)
            return
        log.info("session %s expired", shown(sess.client_id))
        self.end(sess)

    # -- subscriptions -------------------------------------------------------------------------

    def lmq_for(self, topic_filter: str) -> str:
        name = lmq_names.encode(lmq_names.MQTT, topic_filter)
        if name.hashed:
            self.gw.store.put_name(name.topic, topic_filter)
        return name.topic

    async def subscribe(self, sess: Session, sub: Subscription) -> bool:
        """Add or replace a subscription; True if it existed (v5 Retain Handling 1)."""
        existing = sess.subs.get(sub.filter)
        if existing is not None:
            existing.qos = sub.qos
            existing.no_local = sub.no_local
            existing.retain_as_published = sub.retain_as_published
            existing.retain_handling = sub.retain_handling
            existing.sub_id = sub.sub_id
            self.gw.store.put_session(sess.client_id, sess.record()) if sess.persistent else None
            return True
        sub.lmq = self.lmq_for(sub.filter)
        offsets: dict[str, list[int]] = {}
        shared = parse_shared_subscription(sub.filter)
        if shared is None:
            # The start position is read before the filter goes live: whatever is written
            # after the SUBSCRIBE is delivered, nothing older.
            for broker in self.gw.link.brokers:
                top = await self.gw.link.max_offset(broker, sub.lmq)
                offsets[f"{broker}\x00{sub.lmq}"] = [top, top]
        elif sub.lmq not in self.groups:
            for broker in self.gw.link.brokers:
                key = f"{broker}\x00{sub.lmq}"
                if key not in self._group_offsets:
                    self._group_offsets[key] = await self.gw.link.max_offset(broker, sub.lmq)
        route = Route("mqtt", shared.filter if shared is not None else sub.filter, sub.lmq,
                      owner=route_owner(sess.client_id,
                                        None if sess.persistent else self.gw.gateway_id))
        routes = self.gw.routes
        if routes is not None:
            # Live on every gateway that routes to MQTT filters (MQTT, and AMQP through
            # amq.topic), or the wait ran out.
            await routes.add_route(route, wait_for=MQTT_ROUTE_READERS)
        if sess.ended or sub.filter in sess.subs:
            if sess.ended and routes is not None:
                routes.post("remove", route)
            return sub.filter in sess.subs
        sub.route = route
        self._attach(sess, sub, offsets, shared)
        if sess.persistent:
            self.gw.store.put_session(sess.client_id, sess.record())
            self.persist(sess)
            cs = self.cluster()
            if cs is not None:
                # Answered once the cluster has it too, as the local store has it now
                # (bounded: a broker that is down must not hold SUBACKs for long).
                with trio.move_on_after(CLUSTER_WRITE_WAIT_S):
                    await cs.post_record(sess).wait()
        return False

    def _attach(self, sess: Session, sub: Subscription, offsets: dict, shared) -> None:
        if shared is None:
            shared = parse_shared_subscription(sub.filter)
        link = self.gw.link
        if shared is not None:
            sub.group = shared.group
            sub.topic_filter = shared.filter
            g = self.groups.get(sub.lmq)
            if g is None:
                g = self.groups[sub.lmq] = SharedGroup(sub.lmq, shared.group, shared.filter)
                if link.foreign_writers and self.gw.nursery is not None:
                    g.use_pop(link, self.gw.nursery)  # members on every gateway compete
                for broker in link.brokers:
                    key = g.key(broker)
                    g.part(link, broker, self._group_offsets.get(key, 0))
            g.holders += 1
            if sess.conn is not None:
                g.join(sess, self.gw.link)
        else:
            sub.topic_filter = sub.filter
            for broker in link.brokers:
                pair = offsets.get(f"{broker}\x00{sub.lmq}")
                st = link.state(broker, sub.lmq)
                c = Cursor(st, sub, pair[1] if pair else 0)
                sess.cursors[(broker, sub.lmq)] = c
                if sess.conn is not None:
                    st.watchers.add(sess)
        sess.subs[sub.filter] = sub
        self.trie.add(sub.topic_filter, sub.lmq)
        self.subscription_count += 1
        sess.wake()

    def unsubscribe(self, sess: Session, topic_filter: str) -> bool:
        sub = sess.subs.pop(topic_filter, None)
        if sub is None:
            return False
        self.subscription_count -= 1
        if sub.route is not None and self.gw.routes is not None:
            self.gw.routes.post("remove", sub.route)
        try:
            self.trie.remove(sub.topic_filter, sub.lmq)
        except KeyError:
            pass
        link = self.gw.link
        if sub.group is not None:
            g = self.groups.get(sub.lmq)
            if g is not None:
                g.leave(sess, self.gw.link)
                g.holders -= 1
                if g.holders <= 0:
                    del self.groups[sub.lmq]
                    g.close()
                    for broker in g.parts:
                        self._group_offsets.pop(g.key(broker), None)
                        self.gw.store.put_group_offset(g.key(broker), None)
        else:
            for broker in list(link.brokers):
                c = sess.cursors.pop((broker, sub.lmq), None)
                if c is not None:
                    c.st.watchers.discard(sess)
                    link.release(c.st)
        if sess.persistent and not sess.ended:
            self.gw.store.put_session(sess.client_id, sess.record())
            sess.dirty = True
            cs = self.cluster()
            if cs is not None:
                cs.post_record(sess)
        return True

    def add_brokers(self, brokers: list[str]) -> None:
        """Brokers joined the cluster: every subscription reads their LMQs from the start."""
        link = self.gw.link
        for g in self.groups.values():
            for broker in brokers:
                g.part(link, broker, 0)
                for m in g.members:
                    g.parts[broker].st.watchers.add(m)
        for sess in self.sessions.values():
            for sub in sess.subs.values():
                if sub.group is not None:
                    continue
                for broker in brokers:
                    if (broker, sub.lmq) not in sess.cursors:
                        st = link.state(broker, sub.lmq)
                        sess.cursors[(broker, sub.lmq)] = Cursor(st, sub, 0)
                        if sess.conn is not None:
                            st.watchers.add(sess)
            sess.wake()
        log.info("MQTT sessions now also read broker(s) %s", ", ".join(brokers))

    # -- persistence ----------------------------------------------------------------------------

    def persist(self, sess: Session) -> None:
        """Stage the session's positions, in-flight and QoS 2 state."""
        sess.dirty = False
        if not sess.persistent or sess.ended:
            return
        from gateway.mqtt.session_store import P_INFLIGHT, P_OFFSETS, P_QOS2

        store = self.gw.store
        inflight, qos2 = sess.inflight_record(), sorted(sess.inbound_qos2)
        cs = self.cluster()
        if cs is not None:
            now = {(c.st.broker, c.st.lmq): c.committed for c in sess.cursors.values()}
            last = self._posted.get(sess.client_id, {})
            changed = {k: v for k, v in now.items() if last.get(k) != v}
            if changed:
                self._posted[sess.client_id] = now
                cs.post_offsets(sess.client_id, changed)
            # In-flight ids and inbound QoS 2 ids into the cluster record as they change
            # (a resume elsewhere after a crash re-sends with DUP, same packet ids).
            sig = hash((tuple((e[0], e[2]) for e in inflight), tuple(qos2)))
            if sess.conn is not None and self._state_sig.get(sess.client_id, _NO_STATE) != sig:
                self._state_sig[sess.client_id] = sig
                cs.post_state(sess)
        store.stage(P_OFFSETS, sess.client_id, sess.offsets_record())
        store.stage(P_INFLIGHT, sess.client_id, inflight)
        store.stage(P_QOS2, sess.client_id, qos2)

    def flush(self) -> int:
        """Write everything changed since the last flush (sessions and shared groups)."""
        for sess in self.sessions.values():
            self._persist_dirty(sess)
        return self._flush_groups()

    async def flush_sliced(self) -> int:
        """`flush` for the periodic timer: a slice of the sessions per loop step."""
        await sweep(self.sessions.values(), self._persist_dirty)
        return self._flush_groups()

    def _persist_dirty(self, sess: Session) -> None:
        if sess.dirty:
            self.persist(sess)

    def _flush_groups(self) -> int:
        for g in self.groups.values():
            if g.dirty:
                g.dirty = False
                for broker, part in g.parts.items():
                    key = g.key(broker)
                    committed = part.committed
                    self._group_offsets[key] = committed
                    self.gw.store.put_group_offset(key, committed)
        return self.gw.store.commit()
