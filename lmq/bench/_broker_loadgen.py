"""Load generators of `lmq bench broker`: cheap enough that the server is what they measure.

* `closed_loop` — a fixed number of requests in flight (the window) over a few TCP
  connections. Frames are encoded once, before the clock starts (`encode_frames`): each
  connection has a writer task that, whenever answers have freed slots, sends that many
  pre-built frames in one write, and a reader task that cuts answers by their length
  prefix and reads only `code` (plus, for pulls, the record sizes in the body). No
  per-request task, event or JSON work, so the generator's ceiling sits far above what a
  Python server can answer (the bench measures that ceiling against a canned-answer
  server to prove it).
* `paced_latency` — open loop at a fixed rate: request *i* is due at ``t0 + i / rate`` and
  its latency runs from that due time, so a stalled server cannot hide its stall by
  slowing the generator down (no coordinated omission). One thread and `select`, whose
  timeout has microsecond resolution (trio's epoll sleeps round up to whole
  milliseconds, which would add up to 1 ms of send lateness to every sample).
* `invoke_loop` — N tasks calling `RemotingClient.invoke` back to back: the cost of the
  real client path, used for the in-process transport (which has no bytes to pre-build).

Everything here talks to the address it is given; the bench gives it 127.0.0.1 only.
"""

from __future__ import annotations

import math
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil
import trio

from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand, encode_command_bytes

__all__ = [
    "Latency",
    "Throughput",
    "closed_loop",
    "encode_frames",
    "invoke_loop",
    "paced_latency",
]

_INT = struct.Struct(">i")
_CODE_KEY = b'"code":'
_OPAQUE_KEY = b'"opaque":'
_RECEIVE_SIZE = 256 * 1024
# After the measured interval, answers still in flight get this long to arrive.
_DRAIN_S = 10.0


def encode_frames(cmds: Sequence[RemotingCommand]) -> list[bytes]:
    """Encode `cmds` with opaque = their index (so an answer names its request)."""
    out = []
    for i, cmd in enumerate(cmds):
        cmd.opaque = i
        cmd.flag = 0
        out.append(encode_command_bytes(cmd))
    return out


@dataclass
class Throughput:
    """What one measured interval achieved."""

    seconds: float
    requests: int  # answered with code 0
    messages: int  # messages sent or pulled by those requests
    errors: int  # answered with another code
    first_error: str | None = None
    client_cpu: float | None = None  # CPU seconds per second (1.0 = one core)
    server_cpu: float | None = None

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Latency:
    """Percentiles (ms) of an open-loop run."""

    rate: float
    samples: int
    errors: int
    lost: int
    from_due_ms: dict[str, float] = field(default_factory=dict)  # from the scheduled time
    from_write_ms: dict[str, float] = field(default_factory=dict)  # from the actual write
    first_error: str | None = None


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / p99.9 / max of `values` (nearest rank), in the values' unit."""
    if not values:
        return {}
    data = sorted(values)
    n = len(data)

    def rank(p: float) -> float:
        return data[min(n - 1, max(0, math.ceil(p / 100.0 * n) - 1))]

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "p999": rank(99.9),
            "max": data[-1]}


def _int_at(buf: bytearray | bytes, pos: int, end: int) -> int:
    """The (possibly negative) decimal integer starting at `pos`."""
    j = pos
    if j < end and buf[j] == 45:  # "-"
        j += 1
    while j < end and 48 <= buf[j] <= 57:
        j += 1
    return int(buf[pos:j])


def _header_field(buf: bytearray | bytes, key: bytes, start: int, end: int) -> int:
    i = buf.find(key, start, end)
    if i < 0:
        return -1
    return _int_at(buf, i + len(key), end)


def _count_records(buf: bytearray, start: int, end: int) -> int:
    """Stored records in a pull body (docs/protocol.md §7.1: each starts with its int32 TOTALSIZE)."""
    n = 0
    pos = start
    while end - pos >= 4:
        size = _INT.unpack_from(buf, pos)[0]
        if size <= 0:
            break
        pos += size
        n += 1
    return n


class _CpuClock:
    """CPU seconds used so far by this process and, if known, the server process."""

    def __init__(self, server_pid: int | None) -> None:
        self._server = None
        if server_pid is not None:
            try:
                self._server = psutil.Process(server_pid)
            except psutil.Error:
                self._server = None

    def read(self) -> tuple[float, float | None]:
        own = time.process_time()
        if self._server is None:
            return own, None
        try:
            t = self._server.cpu_times()
            return own, t.user + t.system
        except psutil.Error:
            return own, None


class _Stream:
    """One connection of `closed_loop`: a writer refilling the window, a reader."""

    def __init__(self, stream: trio.SocketStream, frames: list[bytes], start: int,
                 window: int, per_response: int | None) -> None:
        self.stream = stream
        self.frames = frames
        self.next = start % len(frames)
        self.window = window
        self.credits = window
        self.per_response = per_response
        self.wake: trio.Event | None = None
        self.stopping = False
        self.done = trio.Event()
        self.requests = 0
        self.messages = 0
        self.errors = 0
        self.first_error: str | None = None

    async def write_loop(self) -> None:
        frames = self.frames
        nframes = len(frames)
        while not self.stopping:
            k = self.credits
            if k == 0:
                self.wake = trio.Event()
                await self.wake.wait()
                continue
            self.credits = 0
            i = self.next
            if i + k <= nframes:
                chunk = b"".join(frames[i : i + k])
            else:
                chunk = b"".join(frames[i:] + frames[: i + k - nframes])
            self.next = (i + k) % nframes
            await self.stream.send_all(chunk)

    async def read_loop(self) -> None:
        buf = bytearray()
        stream = self.stream
        per_response = self.per_response
        while True:
            data = await stream.receive_some(_RECEIVE_SIZE)
            if not data:
                raise ConnectionError("server closed the connection")
            buf += data
            n = len(buf)
            pos = 0
            answered = 0
            while n - pos >= 8:
                total = _INT.unpack_from(buf, pos)[0]
                end = pos + 4 + total
                if end > n:
                    break
                hstart = pos + 8
                hend = hstart + (_INT.unpack_from(buf, pos + 4)[0] & 0xFFFFFF)
                code = _header_field(buf, _CODE_KEY, hstart, hend)
                if code == 0:
                    self.requests += 1
                    if per_response is None:
                        self.messages += _count_records(buf, hend, end)
                    else:
                        self.messages += per_response
                else:
                    self.errors += 1
                    if self.first_error is None:
                        self.first_error = bytes(buf[hstart:hend]).decode("utf-8", "replace")
                answered += 1
                pos = end
            if pos:
                del buf[:pos]
            if answered:
                self.credits += answered
                if self.wake is not None:
                    self.wake.set()
                    self.wake = None
                if self.stopping and self.credits >= self.window:
                    self.done.set()
                    return


async def closed_loop(
    host: str,
    port: int,
    frames: list[bytes],
    *,
    window: int,
    connections: int,
    warmup: float,
    duration: float,
    per_response: int | None = 1,
    server_pid: int | None = None,
) -> Throughput:
    """Keep `window` requests in flight over `connections` sockets for warmup + duration.

    `frames` are pre-encoded requests, sent round robin. Each answer with code 0 counts
    `per_response` messages (None: count the stored records in its body, for pulls).
    Only answers received during the `duration` after the warm-up are counted.
    """
    connections = max(1, min(connections, window))
    sizes = [window // connections + (1 if i < window % connections else 0)
             for i in range(connections)]
    clock = _CpuClock(server_pid)
    streams: list[_Stream] = []
    async with trio.open_nursery() as nursery:
        for i, size in enumerate(sizes):
            sock_stream = await trio.open_tcp_stream(host, port)
            sock_stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            st = _Stream(sock_stream, frames, i * len(frames) // connections, size,
                         per_response)
            streams.append(st)
            nursery.start_soon(st.read_loop)
            nursery.start_soon(st.write_loop)
        await trio.sleep(warmup)
        t0 = time.perf_counter()
        cpu0 = clock.read()
        base = [(s.requests, s.messages, s.errors) for s in streams]
        await trio.sleep(duration)
        t1 = time.perf_counter()
        cpu1 = clock.read()
        requests = sum(s.requests - b[0] for s, b in zip(streams, base, strict=True))
        messages = sum(s.messages - b[1] for s, b in zip(streams, base, strict=True))
        errors = sum(s.errors - b[2] for s, b in zip(streams, base, strict=True))
        for s in streams:
            s.stopping = True
            if s.wake is not None:
                s.wake.set()
            if s.credits >= s.window:
                s.done.set()
        with trio.move_on_after(_DRAIN_S):
            for s in streams:
                await s.done.wait()
        nursery.cancel_scope.cancel()
    for s in streams:
        await trio.aclose_forcefully(s.stream)
    elapsed = t1 - t0
    first_error = next((s.first_error for s in streams if s.first_error), None)
    return Throughput(
        seconds=elapsed,
        requests=requests,
        messages=messages,
        errors=errors,
        first_error=first_error,
        client_cpu=(cpu1[0] - cpu0[0]) / elapsed,
        server_cpu=None if cpu0[1] is None or cpu1[1] is None
        else (cpu1[1] - cpu0[1]) / elapsed,
    )


def paced_latency(
    host: str,
    port: int,
    frames: list[bytes],
    *,
    rate: float,
    warmup: float,
    duration: float,
) -> Latency:
    """Send `frames` (opaque = index) at `rate` per second, open loop; blocking, one thread.

    Requests are due at fixed times; the latency of each answered request is measured
    both from its due time and from the moment it was written. Only requests due after
    the warm-up count. Answers missing `_DRAIN_S` after the last send count as lost.
    """
    nframes = len(frames)
    due = [0.0] * nframes
    written = [0.0] * nframes
    total = int(rate * (warmup + duration))
    interval = 1.0 / rate
    from_due: list[float] = []
    from_write: list[float] = []
    errors = 0
    first_error: str | None = None
    sock = socket.create_connection((host, port), timeout=10)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        buf = bytearray()
        pending = b""
        start = time.perf_counter() + 0.01
        measure_from = start + warmup
        i = 0
        outstanding = 0
        deadline = math.inf
        while True:
            now = time.perf_counter()
            while i < total and start + i * interval <= now:
                k = i % nframes
                due[k] = start + i * interval
                pending += frames[k]
                written[k] = now
                i += 1
                outstanding += 1
            if pending:
                try:
                    sent = sock.send(pending)
                except BlockingIOError:
                    sent = 0
                pending = pending[sent:]
            if i >= total:
                if outstanding <= 0:
                    break
                if deadline == math.inf:
                    deadline = time.perf_counter() + _DRAIN_S
                timeout = deadline - time.perf_counter()
                if timeout <= 0:
                    break
            else:
                timeout = max(0.0, start + i * interval - time.perf_counter())
            readable, _, _ = select.select([sock], [sock] if pending else [], [], timeout)
            if not readable:
                continue
            data = sock.recv(_RECEIVE_SIZE)
            now = time.perf_counter()
            if not data:
                raise ConnectionError("server closed the connection")
            buf += data
            n = len(buf)
            pos = 0
            while n - pos >= 8:
                end = pos + 4 + _INT.unpack_from(buf, pos)[0]
                if end > n:
                    break
                hstart = pos + 8
                hend = hstart + (_INT.unpack_from(buf, pos + 4)[0] & 0xFFFFFF)
                code = _header_field(buf, _CODE_KEY, hstart, hend)
                k = _header_field(buf, _OPAQUE_KEY, hstart, hend)
                outstanding -= 1
                if code != 0:
                    errors += 1
                    if first_error is None:
                        first_error = bytes(buf[hstart:hend]).decode("utf-8", "replace")
                elif 0 <= k < nframes and due[k] >= measure_from:
                    from_due.append((now - due[k]) * 1000.0)
                    from_write.append((now - written[k]) * 1000.0)
                pos = end
            if pos:
                del buf[:pos]
    finally:
        sock.close()
    return Latency(
        rate=rate,
        samples=len(from_due),
        errors=errors,
        lost=max(0, outstanding),
        from_due_ms=percentiles(from_due),
        from_write_ms=percentiles(from_write),
        first_error=first_error,
    )


async def invoke_loop(
    client: RemotingClient,
    addr: str,
    make_cmd: Callable[[int], RemotingCommand],
    *,
    concurrency: int,
    warmup: float,
    duration: float,
    per_response: int = 1,
    yield_every: int = 1,
) -> Throughput:
    """`concurrency` tasks each invoking ``make_cmd(i)`` on `addr` back to back, yielding
    to the scheduler at least every `yield_every` requests."""
    requests = 0
    errors = 0
    first_error: str | None = None
    stopping = False
    counter = iter(range(1 << 62))

    async def worker() -> None:
        nonlocal requests, errors, first_error
        invoke = client.invoke
        checkpoint = trio.lowlevel.checkpoint
        for i in counter:
            if stopping:
                return
            resp = await invoke(addr, make_cmd(i))
            if i % yield_every == 0:
                # An in-process invoke whose handler never blocks does not yield, so a
                # loop of them would starve every other task (the clock included).
                await checkpoint()
            if resp.code == 0:
                requests += 1
            else:
                errors += 1
                if first_error is None:
                    first_error = f"code {resp.code}: {resp.remark}"

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
        await trio.sleep(warmup)
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        r0, e0 = requests, errors
        await trio.sleep(duration)
        t1 = time.perf_counter()
        cpu1 = time.process_time()
        r1, e1 = requests, errors
        stopping = True
    elapsed = t1 - t0
    return Throughput(
        seconds=elapsed,
        requests=r1 - r0,
        messages=(r1 - r0) * per_response,
        errors=e1 - e0,
        first_error=first_error,
        client_cpu=(cpu1 - cpu0) / elapsed,
    )
