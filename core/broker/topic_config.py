"""Topic configurations of one broker, persisted in `<data_dir>/config/topics.json`.

The file holds a TopicConfigSerializeWrapper (docs/protocol.md §6.5): `topicConfigTable` plus
a `dataVersion` that changes with every edit, the same JSON the broker sends to the name
servers in REGISTER_BROKER (docs/protocol.md §4.2), and our own `autoCreatedTopics`: the names created by
a send rather than by an administrator, which count against `max_auto_created_topics`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.broker.metadata import encode_json, read_json
from core.broker.persister import FilePersister
from core.common import names
from core.common.sysflag import PermName

log = logging.getLogger(__name__)

SINGLE_TAG = "SINGLE_TAG"
# Default of BrokerConfig.max_auto_created_topics (the reason is given there).
DEFAULT_MAX_AUTO_CREATED_TOPICS = 256
MULTI_TAG = "MULTI_TAG"


@dataclass
class TopicConfig:
    """One topic's queues and permissions on this broker (docs/protocol.md §6.5)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PermName.READ | PermName.WRITE
    topic_filter_type: str = SINGLE_TAG
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(data["topicName"]),
            read_queue_nums=int(data.get("readQueueNums", 16)),
            write_queue_nums=int(data.get("writeQueueNums", 16)),
            perm=int(data.get("perm", 6)),
            topic_filter_type=str(data.get("topicFilterType") or SINGLE_TAG),
            topic_sys_flag=int(data.get("topicSysFlag", 0) or 0),
            order=bool(data.get("order", False)),
        )

    @property
    def queue_nums(self) -> int:
        """Valid queue ids are below this (Java checks max(read, write))."""
        return max(self.read_queue_nums, self.write_queue_nums)


@dataclass
class DataVersion:
    """Version stamp of the topic table; name servers compare it (docs/protocol.md §4.5 QUERY_DATA_VERSION)."""

    timestamp: int = 0
    counter: int = 0

    def bump(self) -> None:
        self.timestamp = int(time.time() * 1000)
        self.counter += 1

    def to_json(self) -> dict[str, int]:
        return {"timestamp": self.timestamp, "counter": self.counter}


class TopicConfigManager:
    """Holds and persists the topic table; fabricates configs for `%LMQ%` topics (docs/protocol.md §10.2).

    `on_change` (set by the controller) is called after every creation, update or
    deletion so the broker re-registers with the name servers right away, as Java does.

    Topics created by a send (from the TBW102 template or a `%RETRY%` name) are
    remembered; once `max_auto_created_topics` of them exist, a send to another unknown
    topic creates nothing (the sender gets TOPIC_NOT_EXIST). With `auto_create_topic`
    off, a send creates no topic from any template: RocketMQ still lets the cluster- or
    broker-name topic serve as one, which would make the setting easy to bypass.
    """

    FILE_NAME = "topics.json"

    def __init__(
        self,
        config_dir: str,
        *,
        broker_name: str,
        cluster_name: str,
        default_topic_queue_nums: int = 8,
        auto_create_topic: bool = True,
        cluster_topic_enable: bool = True,
        broker_topic_enable: bool = True,
        enable_lmq: bool = True,
        schedule_queue_nums: int = 18,
        max_auto_created_topics: int = DEFAULT_MAX_AUTO_CREATED_TOPICS,
    ) -> None:
        self.path = os.path.join(config_dir, self.FILE_NAME)
        self._schedule_queue_nums = schedule_queue_nums
        self.table: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        self.on_change: Callable[[], None] | None = None
        self._broker_name = broker_name
        self._cluster_name = cluster_name
        self._default_queue_nums = default_topic_queue_nums
        self._auto_create = auto_create_topic
        self._cluster_topic = cluster_topic_enable
        self._broker_topic = broker_topic_enable
        self._enable_lmq = enable_lmq
        self._max_auto_created = max_auto_created_topics
        self.auto_created: set[str] = set()
        self._cap_logged = False
        # Writes topics.json off the event loop once the controller runs it (persister.py).
        self.persister = FilePersister(self.path, self._encode)
        # topic -> number of the change that created it, until that change is on disk
        # (a write to the topic is acknowledged after it: `wait_created_durable`).
        self._created: dict[str, int] = {}

    # ------------------------------------------------------------------ persistence
    def load(self) -> None:
        """Read topics.json, then make sure the system topics exist (Java does the same
        in TopicConfigManager's constructor)."""
        data = read_json(self.path, {}) or {}
        for name, raw in (data.get("topicConfigTable") or {}).items():
            try:
                self.table[name] = TopicConfig.from_json(raw)
            except (KeyError, TypeError, ValueError):
                continue
        auto = data.get("autoCreatedTopics") or []
        if isinstance(auto, list):
            self.auto_created = {n for n in auto if isinstance(n, str) and n in self.table}
        version = data.get("dataVersion") or {}
        self.data_version = DataVersion(
            int(version.get("timestamp", 0) or 0), int(version.get("counter", 0) or 0)
        )
        self._ensure_system_topics()
        self.data_version.bump()
        self.persist(force=True)

    def persist(self, *, force: bool = False) -> None:
        """Write topics.json now if it changed (sync: load, shutdown, tools)."""
        self.persister.write_now(force=force)

    def _encode(self) -> bytes:
        data = self.wrapper_json()
        data["autoCreatedTopics"] = sorted(self.auto_created)
        return encode_json(data)

    def _mark_dirty(self) -> None:
        """The running persister writes the change soon; without one, write it now."""
        if not self.persister.mark_dirty():
            self.persist()

    async def flush(self) -> None:
        """Wait until every change made so far is on disk (administrator requests)."""
        await self.persister.flush()

    async def wait_created_durable(self, topic: str) -> None:
        """Wait until `topic`, if it was created recently, is on disk (a no-op for a
        topic whose creation is already durable; raises OSError when the write failed)."""
        change = self._created.get(topic)
        if change is None:
            return
        if not self.persister.is_durable(change):
            await self.persister.flush(change)
        self._created.pop(topic, None)

    def wrapper_json(self) -> dict[str, Any]:
        """TopicConfigSerializeWrapper (docs/protocol.md §6.5) of every configured topic."""
        return {
            "topicConfigTable": {n: tc.to_json() for n, tc in self.table.items()},
            "dataVersion": self.data_version.to_json(),
        }

    def _ensure_system_topics(self) -> None:
        def ensure(name: str, queues: int, perm: int) -> None:
            if name not in self.table:
                self.table[name] = TopicConfig(name, queues, queues, perm)

        rw = PermName.READ | PermName.WRITE
        ensure(names.SELF_TEST_TOPIC, 1, rw)
        if self._auto_create:
            # The auto-creation template: its INHERIT bit is what allows creation (docs/protocol.md §5.1).
            ensure(
                names.AUTO_CREATE_TOPIC_KEY_TOPIC,
                self._default_queue_nums,
                rw | PermName.INHERIT,
            )
        if self._cluster_topic:
            ensure(self._cluster_name, 1, rw | PermName.INHERIT)
        if self._broker_topic:
            ensure(self._broker_name, 1, rw | PermName.INHERIT)
        ensure(names.OFFSET_MOVED_EVENT, 1, rw)
        # One queue per delay level (docs/protocol.md §9.2).
        ensure(names.SCHEDULE_TOPIC, self._schedule_queue_nums, rw)

    # ------------------------------------------------------------------ queries
    def get(self, topic: str) -> TopicConfig | None:
        """The topic's config; for an LMQ name a fabricated 1-queue config (docs/protocol.md §10.2)."""
        tc = self.table.get(topic)
        if tc is None and self._enable_lmq and names.is_lmq(topic):
            return TopicConfig(topic, 1, 1, PermName.READ | PermName.WRITE)
        return tc

    def topics(self) -> list[str]:
        return list(self.table)

    # ------------------------------------------------------------------ changes
    def _changed(self) -> None:
        self.data_version.bump()
        self._mark_dirty()
        if self.on_change is not None:
            self.on_change()

    def _may_auto_create(self, topic: str) -> bool:
        """Room for one more topic created by a send? (logs the first refusal only)"""
        if len(self.auto_created) < self._max_auto_created:
            return True
        if not self._cap_logged:
            self._cap_logged = True
            log.warning(
                "%d topics were auto-created by sends (max_auto_created_topics): sends to "
                "new topics now get TOPIC_NOT_EXIST; create topics with `lmq admin`",
                len(self.auto_created),
            )
        return False

    def create_topic_in_send_message_method(
        self, topic: str, default_topic: str, queue_nums: int, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """Auto-create `topic` from template `default_topic` (docs/protocol.md §5.1 step 2); None when
        auto-creation is off, the cap is reached, or the template is missing or lacks
        the INHERIT bit."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        if not self._auto_create:
            return None
        template = self.table.get(default_topic)
        if template is None or not PermName.is_inherited(template.perm):
            return None
        if not self._may_auto_create(topic):
            return None
        nums = max(1, min(int(queue_nums), template.write_queue_nums))
        tc = TopicConfig(
            topic, nums, nums, template.perm & ~PermName.INHERIT, topic_sys_flag=topic_sys_flag
        )
        self.table[topic] = tc
        self.auto_created.add(topic)
        self._changed()
        self._created[topic] = self.persister.changes
        return tc

    def create_retry_topic_in_send_message_method(
        self, topic: str, topic_sys_flag: int = 0
    ) -> TopicConfig | None:
        """A send to a `%RETRY%` topic that does not exist yet creates it, as in Java
        (consumers' retry topics normally exist from their heartbeat); such topics count
        against the cap like any auto-created topic. None when the cap is reached."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        if not self._may_auto_create(topic):
            return None
        self.auto_created.add(topic)  # before the creation, which persists
        return self.create_topic_in_send_back_method(
            topic, 1, PermName.READ | PermName.WRITE, topic_sys_flag
        )

    def create_topic_in_send_back_method(
        self, topic: str, queue_nums: int, perm: int, topic_sys_flag: int = 0
    ) -> TopicConfig:
        """Create (or return) an internal topic: %RETRY%/%DLQ%/half topics (docs/protocol.md §9.3)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
        self.table[topic] = tc
        self._changed()
        self._created[topic] = self.persister.changes
        return tc

    def update(self, tc: TopicConfig) -> None:
        """Create or replace a topic (UPDATE_AND_CREATE_TOPIC, docs/protocol.md §5.18)."""
        # Configured by an administrator now: no longer counts as auto-created.
        adopted = tc.topic_name in self.auto_created
        self.auto_created.discard(tc.topic_name)
        if self.table.get(tc.topic_name) == tc:
            if adopted:
                self._mark_dirty()
            return
        self.table[tc.topic_name] = tc
        self._changed()

    def delete(self, topic: str) -> bool:
        if self.table.pop(topic, None) is None:
            return False
        self.auto_created.discard(topic)
        self._created.pop(topic, None)
        self._changed()
        return True
