"""Shared bits of the C++-client driver scripts: JSON-line output and message dumps."""

from __future__ import annotations

import json
import sys
import threading
import time

_lock = threading.Lock()

# Properties the tests look at on received messages.
WATCHED_PROPERTIES = (
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "REAL_TOPIC",
    "REAL_QID",
    "DELAY",
    "TRAN_MSG",
    "PGROUP",
    "TRANSACTION_CHECK_TIMES",
    "UNIQ_KEY",
)


def emit(event: str, **fields) -> None:
    """Print one JSON line and flush (callbacks run on native threads: serialised)."""
    fields["event"] = event
    fields.setdefault("t_ms", int(time.time() * 1000))
    line = json.dumps(fields)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def stop_on_stdin_close(stop: threading.Event) -> None:
    """Set `stop` when the parent closes our stdin (or writes a line)."""

    def watch() -> None:
        try:
            sys.stdin.readline()
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=watch, daemon=True).start()


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def describe(msg) -> dict:
    """The fields of a received `rocketmq.client.RecvMessage` as plain JSON values."""
    props = {}
    for name in WATCHED_PROPERTIES:
        value = _text(msg.get_property(name))
        if value:
            props[name] = value
    return {
        "id": _text(msg.id),
        "topic": _text(msg.topic),
        "tags": _text(msg.tags),
        "body": _text(msg.body),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "properties": props,
    }
