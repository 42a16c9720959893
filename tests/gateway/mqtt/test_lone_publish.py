"""A lone publish: once stored, its readers are woken in the same turn of the dispatcher
(no extra pass of the scheduler between the store's answer and the wake-up); a round of
several sends still yields between them (issue 10, latency at low rates)."""

from __future__ import annotations

import zlib

import trio
import trio.testing

from core.client import ClientInstance
from gateway.mqtt import broker_link
from gateway.mqtt.broker_link import STORED, BrokerLink
from gateway.mqtt.config import MqttConfig
from gateway.mqtt.message import MqttMessage


class _Reader:
    def __init__(self) -> None:
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


def _link(queues: int) -> tuple[BrokerLink, _Reader, list]:
    link = BrokerLink(ClientInstance(namesrv_addr="127.0.0.1:1"), MqttConfig(),
                      router=lambda topic: ("%LMQ%m_t",))
    link.queues = [("b", q) for q in range(queues)]
    st = link.state("b", "%LMQ%m_t")
    reader = _Reader()
    st.watchers.add(reader)
    acked: list = []

    async def stored_at_once(broker, qid, reqs):  # the store answered without waiting
        for i, req in enumerate(reqs):
            req.msg.broker = broker
            req.msg.commitlog_offset = 100 + i
        return STORED

    link._send = stored_at_once
    return link, reader, acked


def test_a_lone_publish_wakes_its_readers_without_yielding():
    async def main():
        link, reader, acked = _link(1)
        req = broker_link._Request(MqttMessage("t", b"x"), acked.append)
        with trio.testing.assert_no_checkpoints():
            await link._round([req])
        assert reader.woken == 1 and acked == [STORED]

    trio.run(main)


def test_a_round_of_several_sends_yields_between_them():
    async def main():
        link, reader, acked = _link(8)
        # topics on different store queues: one send each
        reqs = [broker_link._Request(MqttMessage(f"t{i}", b"x"), acked.append) for i in range(8)]
        assert len({hash_queue(link, r.msg.topic) for r in reqs}) > 1
        with trio.testing.assert_checkpoints():
            await link._round(reqs)
        assert acked == [STORED] * 8 and reader.woken == 1  # one wake-up per round

    trio.run(main)


def hash_queue(link: BrokerLink, topic: str) -> tuple[str, int]:
    return link.queues[zlib.crc32(topic.encode()) % len(link.queues)]


def test_remember_run_keeps_what_remember_keeps():
    from gateway.mqtt.lmq_state import LmqState, RecentBudget

    budget_a, budget_b = RecentBudget(3_000_000), RecentBudget(3_000_000)
    a = LmqState("b", "%LMQ%a", budget_a)
    b = LmqState("b", "%LMQ%a", budget_b)
    offset = 0
    for size in (10, 700_000, 0, 5, 900_000, 1, 1):  # past the per-LMQ byte bound
        payload = bytes(size)  # shared: the test holds little memory
        chunk = [MqttMessage("t", payload) for _ in range(700)]
        first = offset
        for i in [*range(4), *range(len(chunk))]:  # a pull brought the first four already
            a.remember(first + i, chunk[i])
        offset += len(chunk)
        b.remember_run(first, chunk[:4])
        b.remember_run(first, chunk)  # entries already known are skipped
        assert list(a.recent) == list(b.recent)
        assert (a.recent_bytes, budget_a.used) == (b.recent_bytes, budget_b.used)
    assert len(a.recent) < offset  # the bounds did cut


def test_the_in_process_store_answers_a_lone_publish_without_a_checkpoint():
    # Through the real in-process broker: the dispatcher (caller_yields) gets the store's
    # answer in the same turn, so the readers are woken without one more scheduler pass.
    from core.remoting.local import caller_yields
    from gateway.mqtt.broker_link import NO_MATCHING_SUBSCRIBERS
    from tests.gateway.mqtt.server_harness import GatewayServer

    with GatewayServer() as srv:
        async def lone_round() -> list:
            caller_yields()  # as BrokerLink._dispatch does
            acked: list = []
            req = broker_link._Request(MqttMessage("lone/t", b"x", 1), acked.append)
            with trio.testing.assert_no_checkpoints():
                await srv.gateway.link._round([req])
            return acked

        assert trio.from_thread.run(lone_round, trio_token=srv._token) == [
            NO_MATCHING_SUBSCRIBERS]
