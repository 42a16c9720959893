"""MQTT 3.1.1 load generator of `lmq bench mqtt`: worker processes speaking raw MQTT.

paho spends tens of microseconds per message; a generator built on it would measure
itself. Here every PUBLISH a worker sends is encoded once, before the clock starts, with
the project's codec (`MqttCodec(role="client")`), and joined into batches that go out in
one `sendall`; received bytes are walked by `scan()`, which reads only the fixed header,
the topic length and (for QoS 1) the packet id — never a full decode.

The workers use plain non-blocking sockets and one `selectors` loop per process, not
trio: a fan-out subscriber process reads many connections that each deliver a few small
segments at a time, and an event loop's per-read cost (tens of microseconds in trio,
a few in a bare epoll loop) would otherwise become the generator's ceiling. The servers
under test keep their own design; this is only the measuring instrument.

Each worker is a process of its own (forked by the parent, `multiprocessing` "fork"
context), so the generator's CPU is not the server's. Workers and the parent share:

* `counters` (RawArray of int64): one slot per worker — messages sent (publishers) or
  received (subscribers); each slot is written by one process only;
* `ctl` (RawArray of int32): ctl[0] = phase state (WAIT -> GO -> STOP -> EXIT);
  ctl[1] = 1 while latencies are being recorded (after the warm-up);
* `results` (a Queue): ("ready", name, connections), ("error", name, text),
  ("latency", name, [seconds ...]); open-loop roles also ("window_sent", name, count)
  and ("open", name, in window, within 1 s, [latencies]) (lmq/bench/_mqtt_paced.py);
* `times` (RawArray of double): the measured window [start, end] (monotonic clock).

End-to-end window: publishers stop sending while (messages sent by all publishers) -
(messages received by all subscribers / fan-out) exceeds `window`, so a server is driven
at the rate it sustains, not into an unbounded backlog (the figure is what subscribers
receive). A window that does not drain for `stall_s` is written off (QoS 0 may be
dropped by design) so that a lossy server cannot stall the run.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import Connect, Publish, Subscribe, Subscription
from lmq.bench._mqtt_paced import paced_publishers, window_stats

__all__ = ["EXIT", "GO", "STOP", "WAIT", "Job", "open_connections", "scan", "worker_main"]

WAIT, GO, STOP, EXIT = 0, 1, 2, 3
_TS = struct.Struct(">d")
_PUBACK = b"\x40\x02"
_RECV_SIZE = 1 << 16  # below glibc's mmap threshold: no mmap per recv()
_CONNECT_CHUNK = 256  # connections opened before waiting for their CONNACKs
_HANDSHAKE_TIMEOUT_S = 60.0


@dataclass
class Job:
    """What one worker process does."""

    name: str
    role: str  # "pub" | "sub" | "latency_pub" | "paced_pub" | "idle"
    host: str
    port: int
    slot: int  # its counter
    conns: int = 1
    client_prefix: str = "bench"
    topics: list[str] = field(default_factory=list)  # pub: topic of connection i (cycled)
    topic_filter: str = ""  # sub
    qos: int = 0
    size: int = 64
    batch: int = 64  # messages per sendall
    inflight: int = 64  # QoS 1 PUBLISHes awaiting PUBACK per connection
    window: int = 0  # end-to-end window; 0 = none (ceiling phases)
    fanout: int = 1  # deliveries per publish (subscribers per message)
    pub_slots: tuple[int, ...] = ()
    sub_slots: tuple[int, ...] = ()
    rate: float = 0.0  # latency_pub: messages per second
    record_latency: bool = False  # sub: collect end-to-end latencies
    stall_s: float = 0.5
    record_open: bool = False  # sub: (due, latency) of every stamped message (open loop)
    cpus: tuple[int, ...] = ()  # pin the worker process to these CPUs (empty: no pinning)
    phase_s: float = 0.0  # paced_pub: offset of this process's schedule (staggering)


def scan(data: bytes | bytearray, pos: int, acks: list[bytes] | None,
         stamps: list[float] | None) -> tuple[int, int]:
    """Walk complete packets in data[pos:]; return (PUBLISH count, position after them).

    For a QoS > 0 PUBLISH, append its PUBACK to `acks`; with `stamps`, append the send
    time carried in the first 8 payload bytes. Other packets are skipped.
    """
    n = len(data)
    count = 0
    while pos + 2 <= n:
        b0 = data[pos]
        length = data[pos + 1]
        head = 2
        if length & 0x80:  # Remaining Length of 2..4 bytes (§2.1.4)
            length &= 0x7F
            shift = 7
            p = pos + 2
            while True:
                if p >= n:
                    return count, pos
                b = data[p]
                length |= (b & 0x7F) << shift
                p += 1
                if not b & 0x80:
                    break
                shift += 7
            head = p - pos
        end = pos + head + length
        if end > n:
            break
        if b0 >> 4 == 3:
            count += 1
            if (b0 & 0x06) or stamps is not None:
                start = pos + head
                p = start + 2 + ((data[start] << 8) | data[start + 1])
                if b0 & 0x06:
                    if acks is not None:
                        acks.append(_PUBACK + bytes(data[p:p + 2]))
                    p += 2
                if stamps is not None and end - p >= 8:
                    stamps.append(_TS.unpack_from(data, p)[0])
        pos = end
    return count, pos


# ------------------------------------------------------------------------ connections
def _codec() -> MqttCodec:
    return MqttCodec(role="client", protocol_version=4)


def publish_batches(topic: str, qos: int, size: int, batch: int, pool: int) -> list[bytes]:
    """`pool` PUBLISHes (packet ids 1..pool for QoS 1) joined `batch` at a time."""
    codec = _codec()
    payload = bytes(size)
    packets = [codec.encode(Publish(topic, payload, qos, packet_id=(i + 1) if qos else None))
               for i in range(pool)]
    return [b"".join(packets[i:i + batch]) for i in range(0, pool, batch)]


def open_connections(host: str, port: int, names: list[str], sub: Subscription | None
                     ) -> list[socket.socket]:
    """TCP + CONNECT (+ SUBSCRIBE) for every name; returns once all are acknowledged.

    Opened `_CONNECT_CHUNK` at a time (CONNECTs pipelined, then the CONNACKs collected),
    so that 10k connections neither overflow the server's accept backlog nor wait for
    one round trip each.
    """
    codec = MqttCodec(role="client")
    socks: list[socket.socket] = []
    want = 4 + (5 if sub is not None else 0)  # CONNACK (+ SUBACK)
    extra = _codec().encode(Subscribe(1, (sub,))) if sub is not None else b""
    for first in range(0, len(names), _CONNECT_CHUNK):
        chunk = []
        for name in names[first:first + _CONNECT_CHUNK]:
            s = socket.create_connection((host, port), timeout=_HANDSHAKE_TIMEOUT_S)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(codec.encode(Connect(client_id=name, protocol_version=4,
                                           clean_start=True, keepalive=0)) + extra)
            chunk.append((name, s))
        for name, s in chunk:
            got = b""
            while len(got) < want:
                part = s.recv(want - len(got))
                if not part:
                    raise ConnectionError(f"{name}: closed during CONNECT/SUBSCRIBE")
                got += part
            if got[0] != 0x20 or got[3] != 0:
                raise ConnectionError(f"{name}: CONNACK refused ({got[:4].hex()})")
            if sub is not None and (got[4] != 0x90 or got[8] >= 0x80):
                raise ConnectionError(f"{name}: SUBSCRIBE refused ({got[4:].hex()})")
            s.setblocking(False)
            socks.append(s)
    return socks


# ------------------------------------------------------------------------ roles
class _Worker:
    def __init__(self, job: Job, counters, ctl, results) -> None:
        self.job = job
        self.counters = counters
        self.ctl = ctl
        self.results = results
        self.socks: list[socket.socket] = []

    def wait_state(self, state: int) -> None:
        while self.ctl[0] < state:
            time.sleep(0.002)

    def close_all(self) -> None:
        for s in self.socks:
            try:
                s.setblocking(True)
                s.settimeout(1.0)
                s.sendall(b"\xe0\x00")  # DISCONNECT
            except OSError:
                pass
            s.close()

    # -- publishers: closed loop under the window and the QoS 1 in-flight limit
    def publishers(self) -> None:
        job, counters, ctl = self.job, self.counters, self.ctl
        pool = max(job.inflight * 4, job.batch * 4)
        conns = []
        for i, s in enumerate(self.socks):
            batches = publish_batches(job.topics[i % len(job.topics)], job.qos, job.size,
                                      job.batch, pool)
            conns.append([s, batches, 0, 0, 0, b""])  # sock, batches, next, sent, acked, rest
        per_batch = scan(conns[0][1][0], 0, None, None)[0]
        pub_slots, sub_slots, fanout = job.pub_slots, job.sub_slots, max(1, job.fanout)
        window, inflight, qos, slot = job.window, job.inflight, job.qos, job.slot
        forgiven = 0.0
        last_delivered, blocked_since = -1.0, 0.0
        while ctl[0] == GO:
            progressed = False
            for c in conns:
                s = c[0]
                if qos:  # count PUBACKs (4 bytes each: nothing else comes to a publisher)
                    try:
                        data = s.recv(_RECV_SIZE)
                    except BlockingIOError:
                        data = None
                    if data:
                        data = c[5] + data
                        c[4] += len(data) // 4
                        c[5] = data[len(data) - len(data) % 4:]
                    if c[3] - c[4] > inflight:
                        continue
                if window:
                    delivered = sum(counters[k] for k in sub_slots) / fanout
                    if sum(counters[k] for k in pub_slots) - delivered - forgiven > window:
                        now = time.monotonic()
                        if delivered != last_delivered:
                            last_delivered, blocked_since = delivered, now
                        elif now - blocked_since > job.stall_s:  # written off as lost
                            forgiven = sum(counters[k] for k in pub_slots) - delivered
                        continue
                s.setblocking(True)
                s.sendall(c[1][c[2]])
                s.setblocking(False)
                c[2] = (c[2] + 1) % len(c[1])
                c[3] += per_batch
                counters[slot] += per_batch
                progressed = True
            if not progressed:
                time.sleep(0.0002)

    # -- latency publisher: open loop at a fixed rate, stamped with the due time
    def latency_publisher(self) -> None:
        job, ctl = self.job, self.ctl
        codec = _codec()
        s = self.socks[0]
        topic = job.topics[0]
        pad = bytes(max(0, job.size - 8))
        interval = 1.0 / job.rate
        start = time.monotonic()
        k = 0
        while ctl[0] == GO:
            due = start + k * interval
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pid = (k % 65535) + 1 if job.qos else None
            s.setblocking(True)
            s.sendall(codec.encode(Publish(topic, _TS.pack(due) + pad, job.qos, packet_id=pid)))
            s.setblocking(False)
            try:
                while s.recv(_RECV_SIZE):  # PUBACKs: read and dropped
                    pass
            except BlockingIOError:
                pass
            k += 1
            self.counters[job.slot] += 1

    # -- subscribers: count (and ack, and time) what arrives, one selector for all
    def subscribers(self, stamps: list[float] | None, dues: list[float] | None = None,
                    lats: list[float] | None = None) -> None:
        """`stamps`: latencies after the warm-up; `dues`/`lats`: every stamped message's
        due time and latency from GO on (the open-loop phases judge them by due time)."""
        counters, ctl, slot = self.counters, self.ctl, self.job.slot
        sel = selectors.DefaultSelector()
        rest: dict[int, bytes] = {}
        for s in self.socks:
            sel.register(s, selectors.EVENT_READ, s)
            rest[s.fileno()] = b""
        while ctl[0] < EXIT:
            for key, _ in sel.select(0.05):
                s = key.data
                try:
                    data = s.recv(_RECV_SIZE)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(s)
                    continue
                fd = s.fileno()
                if rest[fd]:
                    data = rest[fd] + data
                acks: list[bytes] = []
                if dues is not None:
                    ts = []
                elif stamps is not None and ctl[1]:
                    ts = []
                else:
                    ts = None
                count, pos = scan(data, 0, acks, ts)
                if ts:
                    now = time.monotonic()
                    if dues is not None:
                        dues.extend(ts)
                        lats.extend(now - t for t in ts)
                    else:
                        stamps.extend(now - t for t in ts)
                rest[fd] = data[pos:]
                counters[slot] += count
                if acks:
                    s.setblocking(True)
                    s.sendall(b"".join(acks))
                    s.setblocking(False)
        sel.close()


def _run(job: Job, counters, ctl, results, times=None) -> None:
    if job.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, job.cpus)
    w = _Worker(job, counters, ctl, results)
    sub = Subscription(job.topic_filter, qos=job.qos) if job.role == "sub" else None
    names = [f"{job.client_prefix}-{i}" for i in range(job.conns)]
    try:
        w.socks = open_connections(job.host, job.port, names, sub)
        results.put(("ready", job.name, len(w.socks)))
        w.wait_state(GO)
        stamps: list[float] | None = [] if job.record_latency else None
        dues: list[float] | None = [] if job.record_open else None
        lats: list[float] = []
        sent = None
        if job.role == "pub":
            w.publishers()
        elif job.role == "latency_pub":
            w.latency_publisher()
        elif job.role == "paced_pub":
            sent = paced_publishers(w.socks, job, counters, ctl)
        elif job.role == "sub":
            w.subscribers(stamps, dues, lats)
        w.wait_state(EXIT)
        if stamps is not None:
            results.put(("latency", job.name, stamps))
        if sent is not None:
            results.put(("window_sent", job.name, sent.in_window(times[0], times[1])))
        if dues is not None:
            results.put(("open", job.name, *window_stats(dues, lats, times[0], times[1])))
    finally:
        w.close_all()


def worker_main(job: Job, counters, ctl, results, times=None) -> None:
    """Entry point of a worker process (`times`: the measured window, set by the parent)."""
    try:
        _run(job, counters, ctl, results, times)
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        results.put(("error", job.name, f"{type(exc).__name__}: {exc}"))
