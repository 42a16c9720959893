"""Consumer offsets: `<data_dir>/config/consumerOffset.json`, written atomically every
`flush_consumer_offset_interval_s` (Java: 5 s) and at shutdown.

Two tables, as Java's LmqConsumerOffsetManager keeps them (docs/protocol.md §10.2):

* `offsetTable`: `"<topic>@<group>" -> {queueId: offset}` for ordinary groups;
* `lmqOffsetTable`: `"<topic>@<group>" -> offset` for groups starting with `%LMQ%`
  (an LMQ has one queue, id 0, so one number is enough).

An offset is "the next message to consume" (last consumed queue offset + 1, docs/protocol.md §5.4).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from core.broker.metadata import atomic_write_bytes, encode_json, read_json
from core.common import names

TOPIC_GROUP_SEPARATOR = "@"


def _key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


class ConsumerOffsetManager:
    """Committed consumer offsets per (group, topic, queue)."""

    FILE_NAME = "consumerOffset.json"

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, self.FILE_NAME)
        self.table: dict[str, dict[int, int]] = {}
        self.lmq_table: dict[str, int] = {}
        self._dirty = False

    # ------------------------------------------------------------------ persistence
    def load(self) -> None:
        data = read_json(self.path, {}) or {}
        for key, queues in (data.get("offsetTable") or {}).items():
            if not isinstance(queues, dict):
                continue
            parsed: dict[int, int] = {}
            for qid, off in queues.items():
                try:
                    parsed[int(qid)] = int(off)
                except (TypeError, ValueError):
                    continue
            self.table[key] = parsed
        for key, off in (data.get("lmqOffsetTable") or {}).items():
            try:
                self.lmq_table[key] = int(off)
            except (TypeError, ValueError):
                continue

    def persist(self, *, force: bool = False) -> None:
        """Write the file if anything changed since the last write."""
        payload = self.snapshot(force=force)
        if payload is not None:
            self.write(payload)

    def snapshot(self, *, force: bool = False) -> bytes | None:
        """The file content if it changed (None otherwise); marks the table clean. Encode
        on the event loop (the tables change there), then `write` from a worker thread."""
        if not (self._dirty or force):
            return None
        self._dirty = False
        return encode_json(
            {
                "offsetTable": {
                    k: {str(q): o for q, o in v.items()} for k, v in self.table.items()
                },
                "lmqOffsetTable": self.lmq_table,
            }
        )

    def write(self, payload: bytes) -> None:
        """Write a snapshot; on failure the table is marked dirty again and it re-raises."""
        try:
            atomic_write_bytes(self.path, payload)
        except OSError:
            self._dirty = True
            raise

    # ------------------------------------------------------------------ offsets
    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = _key(topic, group)
        if names.is_lmq(group):
            if self.lmq_table.get(key) != offset:
                self.lmq_table[key] = offset
                self._dirty = True
            return
        queues = self.table.get(key)
        if queues is None:
            queues = self.table[key] = {}
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed this queue."""
        key = _key(topic, group)
        if names.is_lmq(group):
            return self.lmq_table.get(key, -1)
        queues = self.table.get(key)
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """All committed queue offsets of (group, topic)."""
        key = _key(topic, group)
        if names.is_lmq(group):
            off = self.lmq_table.get(key)
            return {} if off is None else {names.LMQ_QUEUE_ID: off}
        return dict(self.table.get(key, {}))

    def _pairs(self) -> Iterator[tuple[str, str]]:
        for key in list(self.table) + list(self.lmq_table):
            topic, _, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            yield topic, group

    def topics_of_group(self, group: str) -> set[str]:
        return {t for t, g in self._pairs() if g == group}

    def groups_of_topic(self, topic: str) -> set[str]:
        return {g for t, g in self._pairs() if t == topic}

    def remove_topic(self, topic: str) -> None:
        """Forget every group's offsets of `topic` (DELETE_TOPIC_IN_BROKER)."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        self._remove_keys(lambda key: key.startswith(prefix))

    def remove_group(self, group: str) -> None:
        suffix = TOPIC_GROUP_SEPARATOR + group
        self._remove_keys(lambda key: key.endswith(suffix))

    def _remove_keys(self, doomed) -> None:
        for table in (self.table, self.lmq_table):
            for key in [k for k in table if doomed(k)]:
                del table[key]
                self._dirty = True
