"""Namespaced key/value configuration of the name server (PUT/GET/DELETE_KV_CONFIG).

RocketMQ keeps e.g. the `ORDER_TOPIC_CONFIG` namespace here ("brokerA:8;brokerB:8" per
topic, docs/protocol.md §4.1). In memory only: like every other name-server datum it is rebuilt by whoever
owns it (admin tools), and several name servers share nothing.
"""

from __future__ import annotations

__all__ = ["NAMESPACE_ORDER_TOPIC_CONFIG", "KVConfigManager"]

NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class KVConfigManager:
    """namespace -> {key: value}."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[str, str]] = {}

    def put(self, namespace: str, key: str, value: str) -> None:
        self._tables.setdefault(namespace, {})[key] = value

    def get(self, namespace: str, key: str) -> str | None:
        table = self._tables.get(namespace)
        return None if table is None else table.get(key)

    def delete(self, namespace: str, key: str) -> bool:
        table = self._tables.get(namespace)
        if table is None or key not in table:
            return False
        del table[key]
        if not table:
            del self._tables[namespace]
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace's table, or None when it is empty/unknown."""
        table = self._tables.get(namespace)
        return dict(table) if table else None
