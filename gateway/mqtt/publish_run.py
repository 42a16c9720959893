"""A socket read's 3.1/3.1.1 PUBLISHes decoded in one C call (core/_speedups.c
scan_publishes), for MqttCodec.feed (`publish_runs`). Without the extension, or with
LMQ_PURE_PYTHON=1, `scan_publishes` is None and every packet is decoded into a Publish."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["PubackRun", "PublishRun", "scan_pubacks", "scan_publishes"]

scan_publishes: Callable | None = None
scan_pubacks: Callable | None = None
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import scan_publishes
    except ImportError:
        pass
    try:
        from core._speedups import scan_pubacks
    except ImportError:
        pass


class PublishRun(list):
    """Consecutive 3.1/3.1.1 PUBLISHes of one read, as (topic, payload, fixed-header flags,
    packet id or None) tuples: what `feed` gives, in place of that many `Publish`, to a
    server codec with `publish_runs` set (the gateway's connections). The checks are the
    Python decoder's; a packet that fails one is left to it, so it raises as always."""

    __slots__ = ()


class PubackRun(list):
    """The packet ids of consecutive 4-byte PUBACKs (no reason code, no properties) of one
    read, scanned in one C call (core/_speedups.c scan_pubacks): what `feed` gives, in
    place of that many `Puback`, to a server codec with `publish_runs` set. Anything else
    (a PUBACK with a reason code, packet id 0, bad flags) is left to the Python decoder."""

    __slots__ = ()
