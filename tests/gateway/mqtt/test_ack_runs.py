"""Acknowledgements handled a run at a time (issue 10, CPU per message under fan-in): the
broker link answers a connection's QoS 1 publishes of a round in one `stored_run` call
(one run of PUBACKs, one wake-up of its writer), and a subscriber's run of PUBACKs ends its
QoS 1 flows with one wake-up of its pump. Order and outcomes are those of one call per
message."""

from __future__ import annotations

import socket
import zlib

import trio

from core.client import ClientInstance
from gateway.mqtt import broker_link
from gateway.mqtt.broker_link import (
    NO_MATCHING_SUBSCRIBERS,
    SEND_FAILED,
    STORED,
    BrokerLink,
)
from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.connection_publish import PublishHandler
from gateway.mqtt.message import MqttMessage
from gateway.mqtt.packets import Connect, Puback
from gateway.mqtt.session import Cursor, Inflight, Session, Subscription
from tests.gateway.mqtt.server_harness import GatewayServer


class _Sink:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def stored_run(self, acks: list[int]) -> None:
        self.calls.append(list(acks))


def _link(failing_topic: str | None = None) -> BrokerLink:
    link = BrokerLink(ClientInstance(namesrv_addr="127.0.0.1:1"), MqttConfig(),
                      router=lambda topic: () if topic == "nobody" else ("%LMQ%m_t",))
    link.queues = [("b", q) for q in range(4)]

    async def store(broker, qid, reqs):
        if any(req.msg.topic == failing_topic for req in reqs):
            return SEND_FAILED
        for i, req in enumerate(reqs):
            req.msg.broker = broker
            req.msg.commitlog_offset = 100 + i
        return STORED

    link._send = store
    return link


def _requests(a: _Sink, b: _Sink, calls: list) -> list:
    topics = ["t0", "t1", "nobody", "t3", "t4", "t5"]  # several store queues, one unrouted
    reqs = []
    for pid, topic in enumerate(topics, 1):
        reqs.append(broker_link._Request(MqttMessage(topic, b"x", 1), a, pid))
        reqs.append(broker_link._Request(MqttMessage(topic, b"y", 1), b, 100 + pid))
    reqs.insert(3, broker_link._Request(MqttMessage("t0", b"z", 1), calls.append))
    reqs.insert(5, broker_link._Request(MqttMessage("t1", b"q", 0), None))
    return reqs


def test_a_round_answers_each_sink_once_in_submission_order():
    async def main():
        link = _link()
        a, b, calls = _Sink(), _Sink(), []
        await link._round(_requests(a, b, calls))
        codes = [STORED, STORED, NO_MATCHING_SUBSCRIBERS, STORED, STORED, STORED]
        assert a.calls == [[x for pid, c in enumerate(codes, 1) for x in (pid, c)]]
        assert b.calls == [[x for pid, c in enumerate(codes, 101) for x in (pid, c)]]
        assert calls == [STORED]
        assert link.stats["stored"] == 14 and link.stats["failed"] == 0

    trio.run(main)


def test_failed_sends_reach_the_sinks_with_their_codes():
    async def main():
        link = _link(failing_topic="t3")
        a, b, calls = _Sink(), _Sink(), []
        reqs = _requests(a, b, calls)
        await link._round(reqs)
        # everything sent with t3 (its store queue) failed; the rest was stored
        failed = {req.msg.topic for req in reqs if _queue(link, req.msg.topic) == _queue(link, "t3")}
        want = [x for pid, topic in enumerate(["t0", "t1", "nobody", "t3", "t4", "t5"], 1)
                for x in (pid, SEND_FAILED if topic in failed else
                          NO_MATCHING_SUBSCRIBERS if topic == "nobody" else STORED)]
        assert a.calls == [want]
        assert link.stats["failed"] == sum(req.msg.topic in failed for req in reqs) >= 2
        link.queues = []  # no broker known: the whole round fails
        a, b, calls = _Sink(), _Sink(), []
        link._fail(_requests(a, b, calls), "test")
        assert a.calls == [[x for pid in range(1, 7) for x in (pid, SEND_FAILED)]]
        assert calls == [SEND_FAILED]

    trio.run(main)


def _queue(link: BrokerLink, topic: str) -> tuple[str, int]:
    return link.queues[zlib.crc32(topic.encode()) % len(link.queues)]


class _Conn(PublishHandler):
    """What stored_run uses of a Connection."""

    def __init__(self) -> None:
        self.closed = False
        self.client_id = "c"
        self.inbound = 5
        self.out: list[bytes] = []
        self.woken = 0

    def queue(self, data: bytes) -> None:
        self.out.append(data)

    def wake(self) -> None:
        self.woken += 1

    def close(self) -> None:
        self.closed = True


def test_stored_run_writes_one_run_of_pubacks_and_wakes_once():
    conn = _Conn()
    conn.stored_run([7, STORED, 8, NO_MATCHING_SUBSCRIBERS, 9, STORED])
    assert conn.out == [b"\x40\x02\x00\x07\x40\x02\x00\x08\x40\x02\x00\x09"]
    assert conn.woken == 1 and conn.inbound == 2 and not conn.closed


def test_stored_run_closes_after_the_pubacks_before_a_failure():
    # 3.1.1 cannot say "not stored": the client resends after the close.
    conn = _Conn()
    conn.stored_run([7, STORED, 8, SEND_FAILED, 9, STORED])
    assert conn.out == [b"\x40\x02\x00\x07"] and conn.closed and conn.woken == 0


def test_complete_run_ends_only_qos1_flows_and_wakes_once():
    sess = Session("s", 4, 0)
    cursor = Cursor(None, Subscription("a", 1), 0)
    for pid, qos in ((1, 1), (2, 2), (3, 1)):
        sess.inflight[pid] = Inflight(pid, qos, None, [(cursor, pid)], False, ())
        cursor.unacked.add(pid)
    woken = []
    sess.wake = lambda: woken.append(1)
    sess.complete_run([1, 2, 3, 4])  # 2 is QoS 2 and 4 unknown: ignored
    assert list(sess.inflight) == [2] and cursor.unacked == {2} and woken == [1]
    sess.complete_run([9])
    assert woken == [1]


def test_a_write_of_qos1_publishes_gets_every_puback_in_order():
    with GatewayServer() as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        codec = MqttCodec(protocol_version=4, role="client")
        sock.sendall(codec.encode(Connect("pub", 4)))
        pids = list(range(1, 81))
        body = b"".join(b"\x32\x08\x00\x03a/" + bytes([48 + pid % 4]) + pid.to_bytes(2, "big")
                        + b"p" for pid in pids)
        sock.sendall(body)
        acks: list[int] = []
        while len(acks) < len(pids):
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            acks += [p.packet_id for p in codec.feed(chunk) if type(p) is Puback]
        assert acks == pids
        sock.close()


def test_a_round_is_cut_into_sends_by_bytes_whether_or_not_its_total_is_known():
    # One topic (one store queue): 300 payloads of 8 KiB are 2.4 MiB, more than one send
    # takes; the same round of small payloads goes out in one send.
    async def main():
        for size, many in ((8192, True), (10, False)):
            for counted in (True, False):
                link = _link()
                sizes: list[int] = []
                store = link._send

                async def recorded(broker, qid, reqs, store=store, sizes=sizes):
                    sizes.append(sum(len(r.msg.payload) for r in reqs))
                    return await store(broker, qid, reqs)

                link._send = recorded
                reqs = [broker_link._Request(MqttMessage("t0", bytes(size)), None)
                        for _ in range(300)]
                await link._round(reqs, 300 * size if counted else -1)
                assert sum(sizes) == 300 * size
                assert (len(sizes) > 1) == many
                assert all(s <= broker_link.MAX_BATCH_BYTES for s in sizes)

    trio.run(main)
