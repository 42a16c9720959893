"""MQTT under load it cannot absorb at once (docs/mqtt.md, "Overload").

Publishers here are raw sockets writing pre-encoded PUBLISH packets as fast as TCP takes
them, never waiting for the gateway (open loop, as devices do). The gateway must push back
on them instead of falling behind its subscribers: a subscriber keeps receiving, in order,
and at QoS 1 nothing is lost; a subscriber that does not read its socket must not slow the
others down. No assertion is about time.
"""

from __future__ import annotations

import logging
import multiprocessing
import socket
import struct
import threading
import time

import pytest

from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.packets import (
    PINGREQ,
    Connack,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient, wait_for

SEQ = struct.Struct(">II")  # publisher index, sequence number


def _connect(port: int, client_id: str) -> RawClient:
    c = RawClient(port, version=4)
    ack = c.connect(client_id)
    assert isinstance(ack, Connack) and ack.reason_code == 0
    return c


def _subscribe(c: RawClient, *filters: tuple[str, int]) -> None:
    c.send(Subscribe(1, tuple(Subscription(f, q) for f, q in filters)))
    assert isinstance(c.recv_type(Suback), Suback)


class Flood(threading.Thread):
    """One publisher writing `count` PUBLISHes unpaced (QoS 1 acks are read and ignored)."""

    def __init__(self, port: int, index: int, topic: str, count: int, qos: int,
                 size: int = 64) -> None:
        super().__init__(daemon=True)
        self.client = _connect(port, f"flood-{index}-{topic.replace('/', '-')}")
        codec = MqttCodec(1 << 20, role="client")
        codec.protocol_version = 4
        pad = b"x" * max(0, size - SEQ.size)
        self.chunks = []
        parts = []
        for seq in range(count):
            pid = seq % 65535 + 1 if qos else None
            parts.append(codec.encode(Publish(topic, SEQ.pack(index, seq) + pad, qos, False,
                                              False, pid)))
            if len(parts) == 256:
                self.chunks.append(b"".join(parts))
                parts = []
        if parts:
            self.chunks.append(b"".join(parts))
        self.qos = qos

    def run(self) -> None:
        sock = self.client.sock
        sock.settimeout(None)
        if self.qos:
            threading.Thread(target=self._drain, daemon=True).start()
        for chunk in self.chunks:
            sock.sendall(chunk)

    def _drain(self) -> None:
        try:
            while self.client.sock.recv(1 << 16):
                pass
        except OSError:
            pass


def _reader_main(port: int, client_id: str, filters: list, expected: int, out) -> None:
    """A subscriber process reading as fast as it can (QoS 1 acknowledged at once): apart
    from the in-process test server, so that the GIL does not make it a slow client. It
    stops after `expected` messages or 5 s without any, and sends back what it got."""
    c = _connect(port, client_id)
    _subscribe(c, *[tuple(f) for f in filters])
    out.send("ready")
    got: dict[tuple[str, int], list[int]] = {}
    order: list[str] = []
    count = 0
    c.sock.settimeout(5.0)
    while count < expected:
        try:
            data = c.sock.recv(1 << 18)
        except (TimeoutError, OSError):
            break
        if not data:
            break
        acks = []
        for p in c.codec.feed(data):
            if type(p) is not Publish:
                continue
            index, seq = SEQ.unpack_from(p.payload)
            got.setdefault((p.topic, index), []).append(seq)
            order.append(p.topic)
            count += 1
            if p.qos == 1:
                acks.append(c.codec.encode(Puback(p.packet_id)))
        if acks:
            c.sock.sendall(b"".join(acks))
    out.send((got, order))
    c.close()


class Reader:
    """`_reader_main` in a child process; `result()` waits for what it received."""

    def __init__(self, port: int, client_id: str, filters: list, expected: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_reader_main,
                                args=(port, client_id, filters, expected, child), daemon=True)
        self.proc.start()
        assert self._conn.poll(60) and self._conn.recv() == "ready"

    def result(self, timeout: float = 120) -> tuple[dict, list]:
        assert self._conn.poll(timeout), "the reader got nothing for too long"
        got, order = self._conn.recv()
        self.proc.join(10)
        return got, order


def _in_order(seqs: list[int]) -> bool:
    return all(a < b for a, b in zip(seqs, seqs[1:], strict=False))


@pytest.mark.slow
def test_subscriber_keeps_receiving_while_publishers_flood():
    """Four unpaced publishers (two QoS 1, two QoS 0) against one subscriber of both
    QoS: it receives from the start, in order, and every QoS 1 message."""
    per = 15_000
    # max_session_lag below what is published: a gateway that falls behind cuts the QoS 1
    # backlog (the collapse this test is about) and the test sees the loss.
    with GatewayServer(max_session_lag=10_000) as srv:
        reader = Reader(srv.port, "overload-sub", [("ov/q1/#", 1), ("ov/q0/#", 0)], 4 * per)
        floods = [Flood(srv.port, i, f"ov/q{i % 2}/{i}", per, i % 2) for i in range(4)]
        for f in floods:
            f.start()
        got, _ = reader.result()
        for (topic, _index), seqs in got.items():
            assert _in_order(seqs), topic
        for i in (1, 3):
            assert got[(f"ov/q1/{i}", i)] == list(range(per))  # QoS 1: nothing lost
        q0 = sum(len(got.get((f"ov/q0/{i}", i), [])) for i in (0, 2))
        assert q0 >= 2 * per * 0.9  # QoS 0 may be dropped, but not by a collapse
        assert srv.gateway.stats.dropped == 2 * per - q0


def test_ping_answered_while_publishers_flood():
    """A client that only pings gets its PINGRESPs while unpaced publishers flood (and
    the delivery gate may hold them back): its reads never wait at the gate, no step of the
    busy gateway (reads, dispatch rounds, deliveries, read-deadline sweeps) holds the loop
    for long. The bound is generous (a loaded test machine), the ping count is not."""
    per = 20_000
    with GatewayServer(backpressure_lag=500) as srv:
        reader = Reader(srv.port, "ping-sub", [("pf/#", 0)], 4 * per)
        pinger = _connect(srv.port, "pinger")
        floods = [Flood(srv.port, i, f"pf/{i}", per, 0) for i in range(4)]
        for f in floods:
            f.start()
        waits = []
        while any(f.is_alive() for f in floods) or not waits:
            start = time.monotonic()
            pinger.send(PINGREQ)
            assert isinstance(pinger.recv_type(Pingresp, timeout=10), Pingresp)
            waits.append(time.monotonic() - start)
        got, _ = reader.result()
        assert sum(len(v) for v in got.values()) >= 4 * per * 0.9
        assert max(waits) < 2.0
        pinger.close()


class Trickle(threading.Thread):
    """A subscriber that reads a little now and then (a device on a poor link)."""

    def __init__(self, client: RawClient, size: int = 8192, pause: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.size = size
        self.pause = pause
        self.stop = False

    def run(self) -> None:
        sock = self.client.sock
        sock.settimeout(0.5)
        while not self.stop:
            try:
                if not sock.recv(self.size):
                    return
            except TimeoutError:
                continue
            except OSError:
                return
            time.sleep(self.pause)


def test_slow_subscriber_does_not_slow_a_fast_one(caplog):
    """A QoS 1 subscriber that never acknowledges and a QoS 0 one that reads very slowly:
    the gateway stops waiting for them, the other subscriber gets everything, the slow
    one's QoS 0 backlog is cut (counted, one log line for the episode)."""
    per = 10_000
    caplog.set_level(logging.INFO, logger="gateway.mqtt")
    with GatewayServer(backpressure_lag=500, max_queued_messages=2_000) as srv:
        stuck = _connect(srv.port, "stuck-sub")  # reads, never acknowledges
        _subscribe(stuck, ("slow/1", 1))  # the QoS 1 publisher: its window fills
        mute = Trickle(stuck, 1 << 16, 0.0)
        mute.start()
        slow = _connect(srv.port, "slow-sub")
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        _subscribe(slow, ("slow/#", 0))
        trickle = Trickle(slow)
        trickle.start()
        reader = Reader(srv.port, "fast-sub", [("slow/#", 1)], 2 * per)
        floods = [Flood(srv.port, i, f"slow/{i}", per, i, size=512) for i in range(2)]
        try:
            for f in floods:
                f.start()
            for f in floods:
                f.join(60)
                assert not f.is_alive()  # publishers were not held back for good
            got, _ = reader.result()
            assert wait_for(lambda: srv.gateway.stats.dropped > 0, 30)  # the slow one's
        finally:
            trickle.stop = mute.stop = True
        for i in range(2):
            assert got[(f"slow/{i}", i)] == list(range(per))
        drops = [r for r in caplog.records if "max_queued_messages" in r.getMessage()]
        assert len(drops) == 1
        stuck.close()
        slow.close()


def test_two_filters_of_one_session_both_flow():
    """One session subscribed to two flooded filters (QoS 0 and QoS 1) gets both at their
    rates: the merge of its LMQs does not wait on writes in progress (found: 0-500 msg/s,
    then the QoS 1 backlog cut by max_session_lag)."""
    q0, q1 = 12_000, 6_000
    with GatewayServer(max_session_lag=4_000, backpressure_lag=500) as srv:
        reader = Reader(srv.port, "merge-sub", [("fm/q0", 0), ("fm/q1", 1)], q0 + q1)
        floods = [Flood(srv.port, 0, "fm/q0", q0, 0), Flood(srv.port, 1, "fm/q1", q1, 1)]
        for f in floods:
            f.start()
        got, order = reader.result()
        assert got[("fm/q1", 1)] == list(range(q1))
        got0 = got.get(("fm/q0", 0), [])
        # QoS 0 may be cut past max_session_lag when the reader falls behind (as designed:
        # 82 % arrived in one clean-clone CI run); the starvation this guards against shows as
        # a filter getting almost nothing (first quarter check below) and far fewer than half.
        assert _in_order(got0) and len(got0) >= q0 * 0.5
        first = order[: len(order) // 4]  # both filters flow from the start
        assert first.count("fm/q1") > 0 and first.count("fm/q0") > 0


def test_entry_whose_topic_does_not_match_the_filter_is_skipped():
    """Defence in depth: an LMQ entry whose topic the filter does not match (a foreign
    writer, a routing fault; simulated here with a wrong router) is not delivered."""
    with GatewayServer() as srv:
        sub = _connect(srv.port, "dd-sub")
        _subscribe(sub, ("dd/a", 0))
        gw = srv.gateway
        lmq = gw.registry.sessions["dd-sub"].subs["dd/a"].lmq
        right = gw.link.router

        def wrong(topic: str):
            return (lmq,) if topic == "dd/x" else right(topic)

        srv.call(setattr, gw.link, "router", wrong)
        pub = _connect(srv.port, "dd-pub")
        pub.send(Publish("dd/x", b"stray", 0))
        pub.send(Publish("dd/a", b"ok", 0))
        p = sub.recv_type(Publish)
        assert (p.topic, p.payload) == ("dd/a", b"ok")
        assert gw.link.stats["topic_mismatch"] == 1
        srv.call(setattr, gw.link, "router", right)
        pub.close()
        sub.close()


def test_start_up_objects_frozen_out_of_the_collector():
    """`gc_freeze_at_start`: once serving, what start-up created is out of the cyclic
    GC's scans (they made the first collections under load take tens of ms); the test
    harness turns it off, as embedders of the gateway should."""
    import gc

    gc.unfreeze()
    try:
        with GatewayServer(gc_freeze_at_start=True) as srv:
            assert gc.get_freeze_count() > 0
            c = _connect(srv.port, "after-freeze")  # serves as before
            c.close()
    finally:
        gc.unfreeze()
    with GatewayServer():
        assert gc.get_freeze_count() == 0
