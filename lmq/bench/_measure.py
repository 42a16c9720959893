"""The measured window of one `lmq bench amqp` worker process (`_amqp_load.py`): the
barrier all the workers of a phase pass (`Sync`), the counts and CPU seconds a worker
reports (`Window`) and the warm-up / deadline clock between them (`Measure`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any


class Sync:
    """What the workers of one phase share: a barrier passed once every worker is set up
    (the window starts from there for all of them), and the consumers' delivery count,
    which holds the publisher back (end-to-end window: a phase never measures a
    growing backlog)."""

    def __init__(self, ctx, parties: int) -> None:
        self.barrier = ctx.Barrier(parties)
        self.consumed = ctx.Value("q", 0, lock=False)

    def start(self) -> float:
        self.barrier.wait(timeout=120)
        return time.monotonic()


@dataclass
class Window:
    """Counts at the start and the end of the measured window (and CPU seconds)."""

    role: str
    start: int = 0
    end: int = 0
    total: int = 0
    cpu_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Measure:
    """Waits at the phase's barrier, then runs `warmup` + `duration` seconds: `running(n)`
    takes the count `n` as the window's start once the warm-up is over and says whether
    the deadline is still ahead; `finish(n)` fills in the end count and the CPU seconds
    spent inside the window."""

    def __init__(self, window: Window, sync: Sync, warmup: float, duration: float) -> None:
        self.window = window
        t0 = sync.start()
        self.begin, self.stop = t0 + warmup, t0 + warmup + duration
        self.started = False
        self.cpu0 = cpu_seconds()

    def running(self, count: int) -> bool:
        now = time.monotonic()
        if not self.started and now >= self.begin:
            self.window.start, self.started, self.cpu0 = count, True, cpu_seconds()
        return now < self.stop

    def finish(self, count: int) -> Window:
        w = self.window
        w.end = w.total = count
        w.cpu_s = cpu_seconds() - self.cpu0
        return w
