"""Open-loop publishers of `lmq bench mqtt`: a schedule, not acknowledgements, sets the pace.

Devices do not wait for subscribers, so these publishers send each message at its due
time whatever the server does: message `j` of a worker process is due at
``t0 + j / (connections x rate)`` and goes out on connection ``j mod connections``, so
every connection sends `rate` messages per second and the connections of a process are
evenly staggered (processes are offset by `Job.phase_s`). A worker that wakes up late
sends everything due by then, each connection's messages in one `send()`.

Every PUBLISH is pre-encoded once (MQTT 3.1.1 fixed header and topic of its connection);
only the first 8 payload bytes change: the message's due time (monotonic clock, shared by
the processes of one machine). Latency is measured from the due time, so a server (or a
generator) that falls behind cannot hide its backlog (no coordinated omission).
"""

from __future__ import annotations

import math
import struct
import time
from typing import TYPE_CHECKING

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Publish

if TYPE_CHECKING:
    import socket

    from lmq.bench._mqtt_loadgen import Job

__all__ = ["DELIVERY_DEADLINE_S", "Schedule", "paced_publishers", "window_stats"]

_TS = struct.Struct(">d")
_GO, _SPIN_S = 1, 0.0005
#: A message counts as delivered in time when it arrives this long after its due time.
DELIVERY_DEADLINE_S = 1.0
#: Latencies a subscriber reports for percentiles (an even subsample beyond this).
_LATENCY_SAMPLES = 50_000


class Schedule:
    """Due times of one process's messages: ``t0 + j / rate`` for j = 0, 1, ..."""

    def __init__(self, t0: float, rate: float) -> None:
        self.t0 = t0
        self.rate = rate
        self.sent = 0  # messages 0 .. sent-1 went out

    def due(self, j: int) -> float:
        return self.t0 + j / self.rate

    def due_by(self, now: float) -> int:
        """How many messages are due at `now` (those with due time <= now)."""
        if now < self.t0:
            return 0
        return int((now - self.t0) * self.rate) + 1

    def in_window(self, start: float, end: float) -> int:
        """Messages sent whose due time lies in [start, end]."""
        if end < start or not self.sent:
            return 0
        lo = max(0, math.ceil((start - self.t0) * self.rate - 1e-9))
        hi = min(self.sent - 1, math.floor((end - self.t0) * self.rate + 1e-9))
        return max(0, hi - lo + 1)


def publish_prefix(topic: str, size: int) -> bytes:
    """The encoded QoS 0 PUBLISH of `size` payload bytes, without its payload."""
    packet = MqttCodec(role="client", protocol_version=4).encode(Publish(topic, bytes(size)))
    return packet[:len(packet) - size]


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        n = sock.send(data)
    except BlockingIOError:
        n = 0
    if n < len(data):  # TCP pushes back: wait for it (the schedule keeps running)
        sock.setblocking(True)
        try:
            sock.sendall(data[n:])
        finally:
            sock.setblocking(False)


def paced_publishers(socks: list[socket.socket], job: Job, counters, ctl) -> Schedule:
    """Send on `socks` by the schedule until the phase leaves GO; returns the schedule."""
    if job.size < _TS.size:
        raise ValueError(f"open-loop payloads carry a time stamp: size must be >= {_TS.size}")
    n = len(socks)
    prefixes = [publish_prefix(job.topics[i % len(job.topics)], job.size) for i in range(n)]
    pad = bytes(job.size - _TS.size)
    pack = _TS.pack
    sched = Schedule(time.monotonic() + job.phase_s, job.rate * n)
    slot = job.slot
    while ctl[0] == _GO:
        now = time.monotonic()
        upto = sched.due_by(now)
        k = sched.sent
        if upto <= k:
            time.sleep(max(_SPIN_S, sched.due(k) - now))
            continue
        out: dict[int, list[bytes]] = {}
        for j in range(k, upto):
            i = j % n
            parts = out.get(i)
            if parts is None:
                parts = out[i] = []
            parts.append(prefixes[i])
            parts.append(pack(sched.due(j)))
            parts.append(pad)
        for i, parts in out.items():
            _send(socks[i], b"".join(parts))
        sched.sent = upto
        counters[slot] += upto - k
    return sched


def window_stats(dues: list[float], lats: list[float], start: float, end: float
                 ) -> tuple[int, int, list[float]]:
    """Of the messages received with due time in [start, end]: how many, how many within
    `DELIVERY_DEADLINE_S`, and their latencies (subsampled to at most `_LATENCY_SAMPLES`)."""
    picked = [lat for due, lat in zip(dues, lats, strict=True) if start <= due <= end]
    count = len(picked)
    in_time = sum(1 for lat in picked if lat <= DELIVERY_DEADLINE_S)
    if count > _LATENCY_SAMPLES:
        step = count / _LATENCY_SAMPLES
        picked = [picked[int(i * step)] for i in range(_LATENCY_SAMPLES)]
    return count, in_time, picked
