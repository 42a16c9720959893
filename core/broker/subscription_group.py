"""Consumer-group configurations (SubscriptionGroupConfig, protocol doc §9.3), persisted in
`<data_dir>/config/subscriptionGroup.json`."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from core.broker.metadata import atomic_write_json, read_json
from core.common import names

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
}


@dataclass
class SubscriptionGroupConfig:
    """Per-group settings; defaults are Java's (§9.3)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

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
    """Group table with auto-creation (`autoCreateSubscriptionGroup`, §9.3). Groups named
    `%LMQ%…` are always accepted and never stored (§10.2)."""

    FILE_NAME = "subscriptionGroup.json"

    def __init__(
        self, config_dir: str, *, auto_create: bool = True, retry_max_times: int = 16
    ) -> None:
        self.path = os.path.join(config_dir, self.FILE_NAME)
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self._auto_create = auto_create
        self._retry_max_times = retry_max_times
        self._dirty = False

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

    def persist(self, *, force: bool = False) -> None:
        if not (self._dirty or force):
            return
        atomic_write_json(
            self.path,
            {"subscriptionGroupTable": {n: g.to_json() for n, g in self.table.items()}},
        )
        self._dirty = False

    def _new(self, group: str) -> SubscriptionGroupConfig:
        return SubscriptionGroupConfig(group, retry_max_times=self._retry_max_times)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.table.get(group)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config; created with defaults when auto-creation is on, None when
        it is off and the group is unknown (-> SUBSCRIPTION_GROUP_NOT_EXIST)."""
        sg = self.table.get(group)
        if sg is not None:
            return sg
        if names.is_lmq(group):
            return self._new(group)
        if not self._auto_create:
            return None
        sg = self._new(group)
        self.table[group] = sg
        self._dirty = True
        return sg

    def update(self, sg: SubscriptionGroupConfig) -> None:
        self.table[sg.group_name] = sg
        self._dirty = True

    def delete(self, group: str) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self._dirty = True
        return True
