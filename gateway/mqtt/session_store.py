"""Durable gateway state in one RocksDB directory (msgpack values).

Key space (prefix byte + UTF-8 text):

```
b"s" client_id   -> session record: {"v": protocol, "exp": expiry s | None (never),
                     "subs": [[filter, qos, no_local, rap, rh, sub_id, lmq], ...],
                     "gone": ms the client disconnected (None while connected)}
b"o" client_id   -> offsets {"broker\\x00lmq": [committed, sent]}
b"f" client_id   -> outbound in flight [[pid, qos, state, broker, clog, [[lmq, off], ...],
                     retained topic | None], ...]
b"q" client_id   -> inbound QoS 2 packet ids awaiting PUBREL [pid, ...]
b"r" topic       -> retained message [payload, qos, props..., expiry_at]
b"n" lmq topic   -> filter (name table of hashed LMQ names, lmq_names.py)
b"g" group key   -> committed offset of a shared subscription group on one broker
```

Structural changes (a session created, subscriptions changed, retained set) are written
at once; offsets and in-flight state change per message and are staged, then written in
one WriteBatch every `state_flush_interval_s` (`commit()`). RocksDB's WAL is on, so what
was written survives a kill -9 of the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgpack
from rocksdict import Options, Rdict, WriteBatch

__all__ = ["SessionStore"]

P_SESSION = b"s"
P_OFFSETS = b"o"
P_INFLIGHT = b"f"
P_QOS2 = b"q"
P_RETAINED = b"r"
P_NAME = b"n"
P_GROUP = b"g"


def _key(prefix: bytes, name: str) -> bytes:
    return prefix + name.encode("utf-8")


_pack = msgpack.Packer(use_bin_type=True).pack


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class SessionStore:
    """The gateway's RocksDB; one writer (the event loop)."""

    def __init__(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_keep_log_file_num(2)
        self.path = path
        self.db = Rdict(path, opts)
        self._staged: dict[bytes, bytes | None] = {}

    def close(self) -> None:
        self.commit()
        self.db.close()

    # -- generic -------------------------------------------------------------------

    def _scan(self, prefix: bytes) -> Iterator[tuple[str, Any]]:
        for key, value in self.db.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            yield key[len(prefix):].decode("utf-8"), _unpack(value)

    def _write_now(self, key: bytes, value: Any | None) -> None:
        self._staged.pop(key, None)
        if value is None:
            self.db.delete(key)
        else:
            self.db[key] = _pack(value)

    def stage(self, prefix: bytes, name: str, value: Any | None) -> None:
        """Write `value` (None = delete) with the next `commit()`."""
        self._staged[_key(prefix, name)] = None if value is None else _pack(value)

    def commit(self) -> int:
        """Write everything staged in one batch; returns the number of keys written."""
        staged = self._staged
        if not staged:
            return 0
        self._staged = {}
        batch = WriteBatch(raw_mode=True)
        for key, value in staged.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self.db.write(batch)
        return len(staged)

    # -- sessions ------------------------------------------------------------------

    def load_sessions(self) -> Iterator[tuple[str, dict]]:
        return self._scan(P_SESSION)

    def put_session(self, client_id: str, record: dict) -> None:
        self._write_now(_key(P_SESSION, client_id), record)

    def get_session(self, client_id: str) -> dict | None:
        raw = self.db.get(_key(P_SESSION, client_id))
        return None if raw is None else _unpack(raw)

    def load_state(self, client_id: str) -> tuple[dict, list, list]:
        """(offsets, in-flight, inbound QoS 2 ids) of a session, staged values first."""
        out = []
        for prefix, empty in ((P_OFFSETS, {}), (P_INFLIGHT, []), (P_QOS2, [])):
            key = _key(prefix, client_id)
            raw = self._staged[key] if key in self._staged else self.db.get(key)
            out.append(empty if raw is None else _unpack(raw))
        return out[0], out[1], out[2]

    def delete_session(self, client_id: str) -> None:
        for prefix in (P_SESSION, P_OFFSETS, P_INFLIGHT, P_QOS2):
            self._write_now(_key(prefix, client_id), None)

    # -- retained --------------------------------------------------------------------

    def load_retained(self) -> Iterator[tuple[str, list]]:
        return self._scan(P_RETAINED)

    def put_retained(self, topic: str, record: list | None) -> None:
        """Write (None = delete) a retained message at once: the dispatcher calls this
        before the publisher's PUBACK / PUBREC goes out, so an acknowledged retained
        publish survives a kill -9 (the WAL has it)."""
        self._write_now(_key(P_RETAINED, topic), record)

    # -- names and groups -------------------------------------------------------------

    def put_name(self, lmq: str, name: str) -> None:
        key = _key(P_NAME, lmq)
        if self.db.get(key) is None:
            self._write_now(key, name)

    def get_name(self, lmq: str) -> str | None:
        raw = self.db.get(_key(P_NAME, lmq))
        return None if raw is None else _unpack(raw)

    def load_group_offsets(self) -> dict[str, int]:
        return dict(self._scan(P_GROUP))

    def put_group_offset(self, key: str, offset: int | None) -> None:
        self.stage(P_GROUP, key, offset)
