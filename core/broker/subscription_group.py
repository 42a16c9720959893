"""Consumer-group configurations (SubscriptionGroupConfig, docs/protocol.md §9.3), persisted in
`<data_dir>/config/subscriptionGroup.json`."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any

from core.broker.metadata import encode_json, read_json
from core.broker.persister import FilePersister
from core.common import names

log = logging.getLogger(__name__)

# Default of BrokerConfig.max_auto_created_groups (the reason is given there).
DEFAULT_MAX_AUTO_CREATED_GROUPS = 1000

# JSON key of each field (Java bean names).
_JSON_NAMES = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
    "consume_message_orderly": "consumeMessageOrderly",
}


@dataclass
class SubscriptionGroupConfig:
    """Per-group settings; defaults are Java's (docs/protocol.md §9.3)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    #: FIFO group: POP hands out a message group's messages one in flight at a time
    #: (docs/pop.md "FIFO message groups"; 5.x Settings `subscription.fifo`).
    consume_message_orderly: bool = False

    def to_json(self) -> dict[str, Any]:
        return {_JSON_NAMES[f.name]: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            key = _JSON_NAMES[f.name]
            if key in data and data[key] is not None:
                value = data[key]
                if f.type in ("bool",):
                    value = value if isinstance(value, bool) else str(value).lower() == "true"
                elif f.type in ("int",):
                    value = int(value)
                else:
                    value = str(value)
                kwargs[f.name] = value
        return cls(**kwargs)


class SubscriptionGroupManager:
    """Group table with auto-creation (`autoCreateSubscriptionGroup`, docs/protocol.md §9.3). Groups named
    `%LMQ%…` are always accepted and never stored (docs/protocol.md §10.2).

    Groups created because a client named them (heartbeat, pull, send-back) rather than
    by an administrator are remembered in `auto_created` (persisted as
    `autoCreatedGroups`); once `max_auto_created` of them exist, an unknown group is
    refused as if auto-creation were off (SUBSCRIPTION_GROUP_NOT_EXIST).
    """

    FILE_NAME = "subscriptionGroup.json"

    def __init__(
        self, config_dir: str, *, auto_create: bool = True, retry_max_times: int = 16,
        max_auto_created: int = DEFAULT_MAX_AUTO_CREATED_GROUPS,
    ) -> None:
        self.path = os.path.join(config_dir, self.FILE_NAME)
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self._auto_create = auto_create
        self._retry_max_times = retry_max_times
        self._max_auto_created = max_auto_created
        self.auto_created: set[str] = set()
        self._cap_logged = False
        # Writes the file off the event loop once the controller runs it (persister.py).
        self.persister = FilePersister(self.path, self._encode)

    def load(self) -> None:
        data = read_json(self.path, {}) or {}
        for name, raw in (data.get("subscriptionGroupTable") or {}).items():
            try:
                self.table[name] = SubscriptionGroupConfig.from_json(raw)
            except (TypeError, ValueError):
                continue
        for group in (
            names.TOOLS_CONSUMER_GROUP,
            names.DEFAULT_CONSUMER_GROUP,
            names.TRANS_CHECK_GROUP,
        ):
            self.table.setdefault(group, self._new(group))
        auto = data.get("autoCreatedGroups") or []
        if isinstance(auto, list):
            self.auto_created = {n for n in auto if isinstance(n, str) and n in self.table}

    def persist(self, *, force: bool = False) -> None:
        """Write the file now if it changed (sync: shutdown, tools)."""
        self.persister.write_now(force=force)

    def _encode(self) -> bytes:
        return encode_json({
            "subscriptionGroupTable": {n: g.to_json() for n, g in self.table.items()},
            "autoCreatedGroups": sorted(self.auto_created),
        })

    async def flush(self) -> None:
        """Wait until every change made so far is on disk (administrator requests)."""
        await self.persister.flush()

    def _new(self, group: str) -> SubscriptionGroupConfig:
        return SubscriptionGroupConfig(group, retry_max_times=self._retry_max_times)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.table.get(group)

    def may_create(self, group: str) -> bool:
        """Would `find_or_create(group)` return a config? (logs the first refusal by the
        cap only)"""
        if group in self.table or names.is_lmq(group):
            return True
        if not self._auto_create:
            return False
        if len(self.auto_created) < self._max_auto_created:
            return True
        if not self._cap_logged:
            self._cap_logged = True
            log.warning(
                "%d subscription groups were auto-created by clients (max_auto_created_groups):"
                " new groups now get SUBSCRIPTION_GROUP_NOT_EXIST; create them with `lmq admin`",
                len(self.auto_created),
            )
        return False

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults when auto-creation is on and the cap
        allows, None otherwise (-> SUBSCRIPTION_GROUP_NOT_EXIST)."""
        sg = self.table.get(group)
        if sg is not None:
            return sg
        if names.is_lmq(group):
            return self._new(group)
        if not self.may_create(group):
            return None
        sg = self._new(group)
        self.table[group] = sg
        self.auto_created.add(group)
        self.persister.mark_dirty()
        return sg

    def update(self, sg: SubscriptionGroupConfig) -> None:
        """Create or replace a group (administrator): it no longer counts as auto-created."""
        self.table[sg.group_name] = sg
        self.auto_created.discard(sg.group_name)
        self.persister.mark_dirty()

    def delete(self, group: str) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self.auto_created.discard(group)
        self.persister.mark_dirty()
        return True
