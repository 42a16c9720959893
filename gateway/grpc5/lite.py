"""Lite topics (RocketMQ RIP-83) over our LMQs (docs/grpc.md "Lite topics").

A lite topic is a second-level channel under a parent topic; each is one LMQ, so a
million lite topics cost what a million LMQs cost (an index entry per message, no copy).
The LMQ is named as Apache's, `%LMQ%$<parent>$<lite>` (LMQ names may hold `$`,
core/common/names.py; unambiguous: neither a topic nor a lite topic name has a `$`). Subscriptions are kept per (group, client id) in the front end, replaced by the
clients' periodic COMPLETE_ADD (every 30 s), so a restarted proxy learns them again.
"""

from __future__ import annotations

import re

from core.common.names import LMQ_PREFIX
from gateway.grpc5.convert import GrpcError
from gateway.grpc5.proto import messaging_pb2 as pb

__all__ = ["LiteSubscriptions", "lmq_name", "check_lite_topic"]

_LITE_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def lmq_name(parent: str, lite: str) -> str:
    return f"{LMQ_PREFIX}${parent}${lite}"


def check_lite_topic(name: str, max_length: int) -> str:
    """The name, or ILLEGAL_LITE_TOPIC."""
    if not name or len(name) > max_length or not _LITE_NAME.fullmatch(name):
        raise GrpcError(pb.ILLEGAL_LITE_TOPIC,
                        f"a lite topic is 1..{max_length} characters of [a-zA-Z0-9_-]")
    return name


class LiteSubscriptions:
    """(group, client id) -> (parent topic, set of lite topics), bounded."""

    def __init__(self, quota: int, max_length: int, max_clients: int) -> None:
        self.quota = quota
        self.max_length = max_length
        self.max_clients = max_clients
        self._subs: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def sync(self, group: str, client_id: str, parent: str, action: int,
             names: list[str]) -> None:
        """Apply one SyncLiteSubscription; GrpcError when refused (nothing changed)."""
        checked = {check_lite_topic(n, self.max_length) for n in names}
        key = (group, client_id)
        _, current = self._subs.get(key, (parent, set()))
        if action == pb.PARTIAL_ADD:
            new = current | checked
        elif action == pb.PARTIAL_REMOVE:
            new = current - checked
        elif action == pb.COMPLETE_ADD:
            new = set(checked)
        elif action == pb.COMPLETE_REMOVE:
            new = set()
        else:
            raise GrpcError(pb.BAD_REQUEST, f"unknown action {action}")
        if len(new) > self.quota:
            raise GrpcError(pb.LITE_SUBSCRIPTION_QUOTA_EXCEEDED,
                            f"more than {self.quota} lite topics for one consumer")
        if key not in self._subs and len(self._subs) >= self.max_clients:
            raise GrpcError(pb.TOO_MANY_REQUESTS, "too many lite consumers")
        self._subs[key] = (parent, new)

    def of(self, group: str, client_id: str) -> tuple[str, list[str]] | None:
        """(parent, lite topics) of a lite consumer, None for others."""
        hit = self._subs.get((group, client_id))
        return None if hit is None else (hit[0], sorted(hit[1]))

    def forget(self, client_id: str) -> None:
        for key in [k for k in self._subs if k[1] == client_id]:
            del self._subs[key]
