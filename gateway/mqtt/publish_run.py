"""A socket read's 3.1/3.1.1 PUBLISHes decoded in one C call (core/_speedups.c
scan_publishes), for MqttCodec.feed (`publish_runs`). Without the extension, or with
LMQ_PURE_PYTHON=1, `scan_publishes` is None and every packet is decoded into a Publish."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["PublishRun", "scan_publishes"]

scan_publishes: Callable | None = None
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import scan_publishes
    except ImportError:
        pass


class PublishRun(list):
    """Consecutive 3.1/3.1.1 PUBLISHes of one read, as (topic, payload, fixed-header flags,
    packet id or None) tuples: what `feed` gives, in place of that many `Publish`, to a
    server codec with `publish_runs` set (the gateway's connections). The checks are the
    Python decoder's; a packet that fails one is left to it, so it raises as always."""

    __slots__ = ()
