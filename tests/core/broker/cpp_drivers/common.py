"""Shared helpers of the C++ driver scripts: JSON-line output and message dumps."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

_lock = threading.Lock()


def client_parser(group_default: str | None = None) -> argparse.ArgumentParser:
    """The options every driver takes: --namesrv, --group (required unless a default is
    given) and --topic."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    if group_default is None:
        ap.add_argument("--group", required=True)
    else:
        ap.add_argument("--group", default=group_default)
    ap.add_argument("--topic", required=True)
    return ap


def emit(event: str, **fields) -> None:
    """Print one JSON line and flush (callbacks run on native threads: serialise)."""
    fields["event"] = event
    fields.setdefault("t_ms", int(time.time() * 1000))
    line = json.dumps(fields)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def describe(msg) -> dict:
    """The fields of a `rocketmq.client.RecvMessage` as JSON values."""
    return {
        "id": text(msg.id),
        "topic": text(msg.topic),
        "tags": text(msg.tags),
        "keys": text(msg.keys),
        "body": text(msg.body),
        "body_len": len(msg.body or b""),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "reconsume_times": msg.reconsume_times,
        "store_size": msg.store_size,
        "cluster": text(msg.get_property("CLUSTER")),
    }


def pull_every_queue(args: argparse.Namespace, describe_msg, expression: str = "*") -> int:
    """Read every queue of args.topic once with the C++ PullConsumer (group args.group):
    one {"event": "msg"} line per message (`describe_msg` of it), then {"event": "done",
    "count": n}."""
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    count = 0
    try:
        for msg in consumer.pull(args.topic, expression):
            count += 1
            emit("msg", **describe_msg(msg))
    finally:
        consumer.shutdown()
    emit("done", count=count)
    return 0


def wait_for_stdin_close() -> None:
    """Block until the parent closes our stdin or writes a line (the stop signal)."""
    try:
        sys.stdin.readline()
    except (OSError, ValueError):
        pass
