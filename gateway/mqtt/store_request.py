"""The per-message byte work of the broker link's store request (broker_link.py `_send`):
the batch body and the offsets of the answer, one C call each (core/_speedups.c
batch_body / offset_ids) when the extension is built, else the Python below, which is
the reference the C is tested against (tests/gateway/mqtt/test_store_request.py).
LMQ_PURE_PYTHON=1 uses the Python anyway."""

from __future__ import annotations

import os
from string import hexdigits

from core.common.codec import BATCH_HEAD
from core.common.codec import INT16 as _INT16

__all__ = ["batch_body", "batch_body_py", "offset_ids", "offset_ids_py"]

_SUB_FIXED = BATCH_HEAD.size + 2  # a batch sub-message: header + properties length
_HEX = frozenset(hexdigits)


def batch_body_py(payloads: list[bytes], props: list[bytes]) -> bytes:
    """A batch body (docs/protocol.md §7.7): per message a header, the payload and its
    properties string."""
    if len(payloads) != len(props):
        raise ValueError("batch_body: payloads and props differ in length")
    parts = []
    add = parts.append
    head = BATCH_HEAD.pack
    for payload, pb in zip(payloads, props, strict=True):
        if len(pb) > 32767:
            raise ValueError("batch_body: a size does not fit the format")
        add(head(_SUB_FIXED + len(payload) + len(pb), 0, 0, 0, len(payload)))
        add(payload)
        add(_INT16.pack(len(pb)))
        add(pb)
    return b"".join(parts)


def offset_ids_py(ids: str, n: int) -> list[int] | None:
    """The commitlog offsets of `n` offset msgIds joined by commas (the last 16 hex
    digits of each), or None when there are not `n` of them or one is malformed."""
    parts = ids.split(",")
    if n < 1 or len(parts) != n:
        return None
    out = []
    for part in parts:
        tail = part[-16:]
        if len(tail) != 16 or not _HEX.issuperset(tail):
            return None
        out.append(int(tail, 16))
    return out


batch_body = batch_body_py
offset_ids = offset_ids_py
if os.environ.get("LMQ_PURE_PYTHON", "") in ("", "0"):
    try:
        from core._speedups import batch_body, offset_ids  # noqa: F811
    except ImportError:
        pass
