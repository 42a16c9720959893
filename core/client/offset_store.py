"""Consumer offset stores: at the broker (clustering) or in a local file (broadcasting).

An offset is "the next message to consume" (last consumed + 1, docs/protocol.md §5.4). Both
stores keep a memory table updated as messages are consumed and persisted every 5 s by the
client instance, and once more at shutdown or when a queue moves to another member.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

import trio

from core.client.errors import MQClientError
from core.client.instance import ClientInstance
from core.client.model import MessageQueue

log = logging.getLogger(__name__)


class OffsetStore:
    """Memory table shared by both stores."""

    def __init__(self) -> None:
        self.table: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        """Read persisted offsets (local store only)."""

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        if offset < 0:
            return
        old = self.table.get(mq)
        if old is None or not increase_only or offset > old:
            self.table[mq] = offset

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.get(mq, -1)

    async def read_store(self, mq: MessageQueue) -> int:
        """Persisted offset (-1 when none); raises when the store cannot be asked."""
        raise NotImplementedError

    async def persist(self, mq: MessageQueue) -> None:
        raise NotImplementedError

    async def persist_all(self, mqs: set[MessageQueue] | None = None) -> None:
        raise NotImplementedError

    def remove(self, mq: MessageQueue) -> None:
        self.table.pop(mq, None)


class RemoteOffsetStore(OffsetStore):
    """Offsets at the broker that hosts each queue (QUERY/UPDATE_CONSUMER_OFFSET, docs/protocol.md §5.3/5.4).

    Updates are two-way requests (Java sends them one-way): a consumer that hands a queue to
    another member knows its offset is stored before the other one reads it.
    """

    def __init__(self, client: ClientInstance, group: str) -> None:
        super().__init__()
        self.client = client
        self.group = group
        self._persisted: dict[MessageQueue, int] = {}

    async def _addr(self, mq: MessageQueue) -> str:
        addr = self.client.find_broker_addr(mq.broker_name)
        if addr is None and not mq.topic.startswith("%LMQ%"):
            await self.client.update_route(mq.topic)
            addr = self.client.find_broker_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(f"The broker[{mq.broker_name}] not exist")
        return addr

    async def read_store(self, mq: MessageQueue) -> int:
        addr = await self._addr(mq)
        offset = await self.client.api.query_consumer_offset(addr, self.group, mq.topic, mq.queue_id)
        if offset >= 0:
            self.update(mq, offset)
            self._persisted[mq] = offset
        return offset

    async def persist(self, mq: MessageQueue) -> None:
        offset = self.table.get(mq)
        if offset is None or self._persisted.get(mq) == offset:
            return
        addr = await self._addr(mq)
        await self.client.api.update_consumer_offset(addr, self.group, mq.topic, mq.queue_id, offset)
        self._persisted[mq] = offset

    async def persist_all(self, mqs: set[MessageQueue] | None = None) -> None:
        for mq in list(self.table):
            if mqs is not None and mq not in mqs:
                continue
            try:
                await self.persist(mq)
            except Exception as exc:
                log.debug("persisting offset of %s failed: %r", mq, exc)

    def remove(self, mq: MessageQueue) -> None:
        super().remove(mq)
        self._persisted.pop(mq, None)


class LocalFileOffsetStore(OffsetStore):
    """Offsets in ``<offset_store_dir>/<instance name>/<group>/offsets.json`` (broadcasting:
    every member reads every queue, so each keeps its own progress). Written atomically."""

    def __init__(self, client: ClientInstance, group: str) -> None:
        super().__init__()
        cfg = client.config
        self.path = os.path.join(cfg.offset_store_dir, str(cfg.instance_name).replace(os.sep, "_"),
                                 group, "offsets.json")

    async def load(self) -> None:
        self.table.update(await trio.to_thread.run_sync(self._read_file))

    def _read_file(self) -> dict[MessageQueue, int]:
        for path in (self.path, self.path + ".bak"):
            try:
                with open(path, encoding="utf-8") as fh:
                    obj = json.load(fh)
                return {MessageQueue.from_json(e): int(e["offset"]) for e in obj.get("offsetTable", [])}
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable offset file %s: %r", path, exc)
        return {}

    async def read_store(self, mq: MessageQueue) -> int:
        offset = (await trio.to_thread.run_sync(self._read_file)).get(mq, -1)
        if offset >= 0:
            self.update(mq, offset)
        return offset

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all()

    async def persist_all(self, mqs: set[MessageQueue] | None = None) -> None:
        if not self.table:
            return
        data = {"offsetTable": [dict(mq.to_json(), offset=off) for mq, off in sorted(self.table.items())]}
        await trio.to_thread.run_sync(self._write_file, json.dumps(data, indent=1))

    def _write_file(self, text: str) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(self.path):
            try:
                os.replace(self.path, self.path + ".bak")
            except OSError:
                pass
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".offsets.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
