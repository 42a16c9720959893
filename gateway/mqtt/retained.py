"""Retained messages: the last RETAIN=1 message per topic, durable in the gateway's KV.

A retained publish is stored in the CommitLog like any other (and delivered to current
subscribers); once the broker has stored it, the gateway keeps it here as well, keyed by
topic (MQTT-3.3.1-5). An empty payload deletes it (MQTT-3.3.1-6/-7). A new subscription
receives the retained messages its filter matches, RETAIN=1, unless its Retain Handling
says otherwise (v5 §3.8.3.1). Expired messages are dropped when found (MQTT-3.3.2-5).

The table lives in memory too (topic -> message), and the topic names are indexed by
level in a tree (`_Level`), so matching a filter walks only the branches it can match: a
literal level is one dict lookup, `+` visits the children of one node, `#` the subtree
below it. A SUBSCRIBE with many wildcard filters thus costs what they match, not
filters x retained messages. `match_bounded` (used on SUBSCRIBE) also yields to the event
loop every `CHECKPOINT_EVERY` nodes visited and stops after `limit` messages
(`max_retained_per_subscription`), so one subscriber cannot hold the loop.

Several gateways: every retained publish is also indexed into `RETAINED_LMQ` (one stored
copy), and `RetainedFollower` on every gateway long-polls that LMQ on each broker and
applies what it reads (`apply_stored`). A topic always goes to the same broker, so the
commitlog offset there orders its retained messages: an entry at or below the one a topic
holds (or was deleted at, `_deleted`) is old and skipped, whichever gateway wrote it. The
follower's positions are kept in the gateway's KV; a new gateway reads the LMQ from its
start (what retention left).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import trio

from core.client import PullStatus
from core.client.errors import MQClientError
from core.common.sysflag import PullSysFlag
from core.remoting.errors import RemotingError
from gateway.mqtt.message import (
    MqttMessage,
    from_message_ext,
    from_properties,
    now_ms,
    to_properties,
)
from gateway.mqtt.session_store import SessionStore
from gateway.mqtt.topics import is_wildcard_filter

__all__ = ["CHECKPOINT_EVERY", "MAX_TOMBSTONES", "RetainedFollower", "RetainedStore"]

log = logging.getLogger(__name__)

#: Deleted retained topics remembered with the offset of their delete (so that an older
#: retained message of another gateway read later does not bring them back).
MAX_TOMBSTONES = 100_000

#: Nodes of the topic tree visited (and messages matched) between two checkpoints of
#: `match_bounded`: a few hundred microseconds of work.
CHECKPOINT_EVERY = 256


class _Level:
    """One level of the retained topic names: children by level name, and the full topic
    name when a retained message ends here."""

    __slots__ = ("children", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.topic: str | None = None


class RetainedStore:
    """topic -> retained message, mirrored in `SessionStore` (prefix b"r")."""

    def __init__(self, store: SessionStore, max_retained: int) -> None:
        self.store = store
        self.max_retained = max_retained
        self.messages: dict[str, MqttMessage] = {}
        self._root = _Level()
        #: topic -> (broker, commitlog offset) of its delete, newest last
        self._deleted: OrderedDict[str, tuple[str | None, int]] = OrderedDict()

    def load(self) -> int:
        for topic, record in self.store.load_retained():
            payload, props = record
            msg = from_properties(props, payload)
            if msg is not None:
                msg.retain = True
                self._keep(topic, msg)
        return len(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    # -- the level index -----------------------------------------------------------------

    def _keep(self, topic: str, msg: MqttMessage) -> None:
        if topic not in self.messages:
            node = self._root
            for level in topic.split("/"):
                child = node.children.get(level)
                if child is None:
                    child = node.children[level] = _Level()
                node = child
            node.topic = topic
        self.messages[topic] = msg

    def _drop(self, topic: str) -> bool:
        if self.messages.pop(topic, None) is None:
            return False
        path = [self._root]
        for level in topic.split("/"):
            child = path[-1].children.get(level)
            if child is None:  # cannot happen: every kept topic is indexed
                return True
            path.append(child)
        path[-1].topic = None
        levels = topic.split("/")
        for i in range(len(levels), 0, -1):  # prune the empty branch
            node = path[i]
            if node.topic is not None or node.children:
                break
            del path[i - 1].children[levels[i - 1]]
        return True

    def _walk(self, topic_filter: str) -> Iterator[str | None]:
        """Topic names `topic_filter` matches, interleaved with None for every node
        visited (the caller's unit of work). Safe across awaits: children are listed
        before a branch is entered, and a topic dropped meanwhile is skipped by the caller."""
        f_levels = topic_filter.split("/")
        n = len(f_levels)
        stack: list[tuple[_Level, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            yield None
            if i == n:
                if node.topic is not None:
                    yield node.topic
                continue
            level = f_levels[i]
            if level == "#":  # this level ("a/#" matches "a") and everything below
                sub = [node] if i > 0 else []
                if i == 0:  # MQTT-4.7.2-1: a leading wildcard skips `$` names
                    sub.extend(c for k, c in node.children.items() if not k.startswith("$"))
                while sub:
                    cur = sub.pop()
                    yield None
                    if cur.topic is not None:
                        yield cur.topic
                    sub.extend(cur.children.values())
            elif level == "+":
                for key, child in list(node.children.items()):
                    if i == 0 and key.startswith("$"):
                        continue
                    stack.append((child, i + 1))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, i + 1))

    # -- the table -----------------------------------------------------------------------

    def would_refuse(self, topic: str, payload_len: int) -> bool:
        """True if storing a new retained topic would exceed `max_retained`."""
        return (payload_len > 0 and topic not in self.messages
                and len(self.messages) >= self.max_retained)

    def set(self, msg: MqttMessage) -> None:
        """Apply a stored RETAIN=1 publish: keep it, or delete on an empty payload."""
        topic = msg.topic
        if not msg.payload:
            if msg.broker is not None and msg.commitlog_offset >= 0:
                deleted = self._deleted
                deleted[topic] = (msg.broker, msg.commitlog_offset)
                deleted.move_to_end(topic)
                if len(deleted) > MAX_TOMBSTONES:
                    deleted.popitem(last=False)
            if self._drop(topic):
                self.store.put_retained(topic, None)
            return
        self._deleted.pop(topic, None)
        if topic not in self.messages and len(self.messages) >= self.max_retained:
            return
        kept = MqttMessage(topic, bytes(msg.payload), msg.qos, True, msg.props, msg.expiry_at,
                           msg.sender, msg.broker, msg.commitlog_offset)
        self._keep(topic, kept)
        if not topic.startswith("$SYS/"):  # statistics are republished at start anyway
            self.store.put_retained(topic, [kept.payload, to_properties(kept)])

    def apply_stored(self, msg: MqttMessage) -> bool:
        """Apply a retained message read from `RETAINED_LMQ` (any gateway's) unless this
        table holds that topic at the same or a later position; True if applied."""
        topic = msg.topic
        if topic.startswith("$SYS/"):
            return False  # each gateway's own statistics
        held = self.messages.get(topic)
        if held is not None and held.broker == msg.broker \
                and held.commitlog_offset >= msg.commitlog_offset:
            return False
        gone = self._deleted.get(topic)
        if gone is not None and gone[0] == msg.broker and gone[1] >= msg.commitlog_offset:
            return False
        msg.retain = True
        self.set(msg)
        return True

    def get(self, topic: str) -> MqttMessage | None:
        return self.messages.get(topic)

    def _live(self, topic: str, now: int) -> MqttMessage | None:
        msg = self.messages.get(topic)
        if msg is not None and msg.expired(now):
            self._drop(topic)
            self.store.put_retained(topic, None)
            return None
        return msg

    def match(self, topic_filter: str) -> list[MqttMessage]:
        """Retained messages whose topic `topic_filter` matches, expired ones removed."""
        now = now_ms()
        if not is_wildcard_filter(topic_filter):
            msg = self._live(topic_filter, now)
            return [msg] if msg is not None else []
        found = [t for t in self._walk(topic_filter) if t is not None]
        return [m for m in (self._live(t, now) for t in found) if m is not None]

    async def match_bounded(self, topic_filter: str, limit: int) -> tuple[list[MqttMessage], bool]:
        """`match` for a new subscription: at most `limit` messages, with a checkpoint
        every `CHECKPOINT_EVERY` units of work. Returns (messages, True if cut at limit)."""
        now = now_ms()
        if not is_wildcard_filter(topic_filter):
            msg = self._live(topic_filter, now)
            return ([msg] if msg is not None else []), False
        out: list[MqttMessage] = []
        work = 0
        for topic in self._walk(topic_filter):
            work += 1
            if work >= CHECKPOINT_EVERY:
                work = 0
                await trio.lowlevel.checkpoint()
            if topic is None:
                continue
            msg = self._live(topic, now)
            if msg is None:
                continue
            if len(out) >= limit:
                return out, True
            out.append(msg)
        return out, False


class RetainedFollower:
    """Keeps a gateway's `RetainedStore` in step with every gateway's retained publishes:
    one long-polling PULL of `RETAINED_LMQ` per broker (see the module doc)."""

    def __init__(self, link: Any, retained: RetainedStore, lmq: str, *,
                 suspend_ms: int = 15_000, retry_s: float = 1.0) -> None:
        self.link = link
        self.retained = retained
        self.lmq = lmq
        self.suspend_ms = suspend_ms
        self.retry_s = retry_s
        self.applied = 0  # messages applied (tests, $SYS)
        self._followed: set[str] = set()

    def key(self, broker: str) -> str:
        return f"{broker}\x00{self.lmq}"

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.follow_new()
            task_status.started()
            await trio.sleep_forever()

    def follow_new(self) -> None:
        """Start following the brokers not followed yet (call after the cluster grew)."""
        for broker in self.link.brokers:
            if broker not in self._followed:
                self._followed.add(broker)
                self._nursery.start_soon(self._follow, broker)

    async def _follow(self, broker: str) -> None:
        store = self.retained.store
        offset = store.load_group_offsets().get(self.key(broker), 0)
        client = self.link.client
        flag = str(int(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND))
        timeout = self.suspend_ms / 1000 + client.config.request_timeout
        while True:
            ext = {"consumerGroup": self.link.config.pull_group, "topic": self.lmq,
                   "queueId": "0", "queueOffset": str(offset), "maxMsgNums": "32",
                   "sysFlag": flag, "commitOffset": "0",
                   "suspendTimeoutMillis": str(self.suspend_ms), "subscription": "*",
                   "subVersion": "0", "expressionType": "TAG"}
            try:
                got = await client.api.pull_message(self.link.addr(broker), ext, timeout)
            except (MQClientError, RemotingError, OSError) as exc:
                log.debug("retained follower pull on %s failed: %r", broker, exc)
                await trio.sleep(self.retry_s)
                continue
            if got.status is PullStatus.FOUND:
                for ext_msg in got.messages:
                    msg = from_message_ext(ext_msg, broker)
                    if msg is not None and self.retained.apply_stored(msg):
                        self.applied += 1
            if got.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL,
                              PullStatus.NO_MATCHED_MSG):
                if got.next_begin_offset != offset:
                    offset = got.next_begin_offset
                    store.put_group_offset(self.key(broker), offset)  # committed by flush
