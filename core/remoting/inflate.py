"""Bounded zlib inflation of peer-sent bodies, off the event loop when large.

A compressed body is a few kilobytes that a peer controls and that may inflate ~1000x
(a 204 KB REGISTER_BROKER body inflated to 64 MiB stalled the process ~250 ms and cost
~130 MB). So bodies are inflated incrementally with `max_length`: work and memory stop
at the caller's cap + 1 byte. The first `ON_LOOP_BYTES` of output are produced on the
loop (most bodies end there); the rest, up to the cap, in a worker thread (zlib releases
the GIL) behind a small limiter, so a stream of bombs queues there instead of stalling
every client.
"""

from __future__ import annotations

import zlib

import trio

__all__ = ["ON_LOOP_BYTES", "InflateLimitError", "inflate", "inflate_async", "run_large"]

#: Output inflated (or bytes parsed) on the event loop before work moves to a thread:
#: ~0.1 ms of zlib, well under a scheduling tick.
ON_LOOP_BYTES = 64 * 1024

class InflateLimitError(ValueError):
    """The body inflates past the cap (a ValueError, as a malformed stream is)."""


# Two large inflations at once at most: memory stays near 2 x cap under a flood.
_limiter = trio.CapacityLimiter(2)


# Output is produced in steps of this size: a refused bomb then costs about the cap, not
# twice it (a single growing output buffer doubles as it goes).
_STEP = 1024 * 1024


def _inflate_rest(inflater, data: bytes, room: int, cap: int) -> bytes:
    """Inflate `data` with `inflater`, at most `room` more bytes; InflateLimitError past."""
    parts = []
    size = 0
    try:
        while True:
            part = inflater.decompress(data, min(_STEP, room - size + 1))
            parts.append(part)
            size += len(part)
            if size > room:
                raise InflateLimitError(f"inflated body exceeds {cap} bytes")
            data = inflater.unconsumed_tail
            if not data and len(part) < _STEP:
                return parts[0] if len(parts) == 1 else b"".join(parts)
    except zlib.error as exc:
        raise ValueError(f"not a zlib stream: {exc}") from None


def inflate(data: bytes, cap: int) -> bytes:
    """Inflate zlib `data`; ValueError when it is not zlib or inflates past `cap` bytes."""
    return _inflate_rest(zlib.decompressobj(), data, cap, cap)


async def inflate_async(data: bytes, cap: int) -> bytes:
    """`inflate`, with everything past the first ON_LOOP_BYTES of output in a thread."""
    inflater = zlib.decompressobj()
    step = min(cap + 1, ON_LOOP_BYTES)
    try:
        head = inflater.decompress(data, step)
    except zlib.error as exc:
        raise ValueError(f"not a zlib stream: {exc}") from None
    if len(head) < step:  # the stream ended within the on-loop budget
        return head
    if len(head) > cap:
        raise InflateLimitError(f"inflated body exceeds {cap} bytes")

    tail = await trio.to_thread.run_sync(
        _inflate_rest, inflater, inflater.unconsumed_tail, cap - len(head), cap,
        limiter=_limiter,
    )
    return head + tail


async def run_large(size: int, fn, *args):
    """Run `fn(*args)` (a parse of `size` peer-sent bytes) on the loop when small, in a
    worker thread (same limiter) when larger than ON_LOOP_BYTES."""
    if size <= ON_LOOP_BYTES:
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args, limiter=_limiter)
