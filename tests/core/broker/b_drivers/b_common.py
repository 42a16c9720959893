"""Shared bits of the C++-client driver scripts: JSON-line output and message dumps."""

from __future__ import annotations

import os
import sys
import threading

# emit() and text() are those of the other driver scripts (tests/core/broker/cpp_drivers).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "cpp_drivers"))
from common import client_parser, emit, pull_every_queue, text  # noqa: E402

__all__ = ["client_parser", "describe", "emit", "pull_every_queue", "stop_on_stdin_close"]

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


def stop_on_stdin_close(stop: threading.Event) -> None:
    """Set `stop` when the parent closes our stdin (or writes a line)."""

    def watch() -> None:
        try:
            sys.stdin.readline()
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=watch, daemon=True).start()


def describe(msg) -> dict:
    """The fields of a received `rocketmq.client.RecvMessage` as plain JSON values."""
    props = {}
    for name in WATCHED_PROPERTIES:
        value = text(msg.get_property(name))
        if value:
            props[name] = value
    return {
        "id": text(msg.id),
        "topic": text(msg.topic),
        "tags": text(msg.tags),
        "body": text(msg.body),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "properties": props,
    }
