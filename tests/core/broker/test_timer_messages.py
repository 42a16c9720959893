"""Timer messages of the 4.x protocol (Apache RocketMQ 5's TIMER_DELAY_SEC, TIMER_DELAY_MS
and TIMER_DELIVER_MS, no DELAY level; core/broker/schedule.py "Timer messages"): held
until their time, checked at send (a half message too), refused with MESSAGE_ILLEGAL
when unusable. Real brokers on free ports, the native client and the C++ client."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

import pytest
import trio
from trio.testing import trio_test

from core.client import ClientInstance, Message, Producer
from core.client.errors import MQBrokerError
from core.client.transaction import LocalTransactionState, TransactionProducer
from core.common.names import SCHEDULE_TOPIC, TRANS_HALF_TOPIC
from core.remoting.codes import ResponseCode
from tests.core.broker.b_harness import b_run
from tests.core.client.cluster import cluster, wait_for
from tests.core.client.test_producer import pull_all

LEVELS = "1s 2s 4s"
MAX_DELAY_S = 60  # timer_max_delay_s of these brokers


def now_ms() -> int:
    return int(time.time() * 1000)


def scheduled(broker) -> int:
    """Records in the delay levels' queues (held messages and their hops)."""
    return sum(broker.store.max_offset(SCHEDULE_TOPIC, q) for q in range(len(LEVELS.split())))


@asynccontextmanager
async def broker_with(topic: str, **broker_kw):
    """A name server and a broker with small levels, `topic` created: (client, broker)."""
    async with cluster(message_delay_level=LEVELS, **broker_kw) as c, \
            ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], topic, 1, 1)
        yield client, c.brokers[0]


async def arrived(client, topic: str, n: int) -> list:
    got: list = []

    async def enough():
        got[:] = await pull_all(client, topic)
        return len(got) >= n
    await wait_for(enough, timeout=30)
    return got


@trio_test
async def test_timer_properties_hold_the_message_until_its_time():
    async with broker_with("TimerT", timer_max_delay_s=MAX_DELAY_S) as (client, broker):
        async with Producer(client, "PG_TIMER") as p:
            sent = now_ms()
            wanted = {b"sec": 1000, b"ms": 2500, b"at": 1000, b"level": 1000}
            for body, props in ((b"sec", {"TIMER_DELAY_SEC": "1", "TIMER_DELAY_MS": "9"}),
                                (b"ms", {"TIMER_DELAY_MS": "2500"}),
                                (b"at", {"TIMER_DELIVER_MS": str(sent + 1000)}),
                                # A DELAY level wins over a relative timer property.
                                (b"level", {"DELAY": "1", "TIMER_DELAY_SEC": "50"})):
                await p.send(Message("TimerT", body, properties=props))
            # Far off (seconds win over an absolute time far beyond the limit): still held.
            await p.send(Message("TimerT", b"later", properties={
                "TIMER_DELAY_SEC": "50", "TIMER_DELIVER_MS": str(sent + 10**9)}))
            assert scheduled(broker) >= 5
            got = {m.body: m for m in await arrived(client, "TimerT", 4)}
        assert set(got) == set(wanted)  # "later" is still waiting
        for body, delay in wanted.items():
            m = got[body]
            # Never before its time (the seconds: 1 s, not the 9 ms beside them).
            assert m.store_timestamp >= sent + delay, body
            assert "DELAY" not in m.properties
            # The relative properties became the absolute time they mean.
            assert "TIMER_DELAY_SEC" not in m.properties and "TIMER_DELAY_MS" not in m.properties
            assert int(m.properties.get("TIMER_DELIVER_MS", 0)) <= m.store_timestamp


@trio_test
async def test_unusable_timer_values_are_refused_and_past_ones_sent_at_once():
    async with broker_with("TimerBad", timer_max_delay_s=MAX_DELAY_S) as (client, broker):
        async with Producer(client, "PG_TIMER_BAD") as p:
            for props in ({"TIMER_DELAY_SEC": "abc"}, {"TIMER_DELAY_MS": "1.5"},
                          {"TIMER_DELIVER_MS": "99999999999999999999"},
                          {"TIMER_DELAY_SEC": str(MAX_DELAY_S + 5)},
                          {"TIMER_DELIVER_MS": str(now_ms() + 2 * MAX_DELAY_S * 1000)}):
                with pytest.raises(MQBrokerError) as refused:
                    await p.send(Message("TimerBad", b"bad", properties=props))
                assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL, props
                assert "timer message illegal" in refused.value.remark
            assert scheduled(broker) == 0
            # A time already past (or a zero delay): delivered at once, not held.
            await p.send(Message("TimerBad", b"past", properties={
                "TIMER_DELIVER_MS": str(now_ms() - 5000)}))
            await p.send(Message("TimerBad", b"zero", properties={"TIMER_DELAY_SEC": "0"}))
        assert sorted(m.body for m in await pull_all(client, "TimerBad")) == [b"past", b"zero"]
        assert scheduled(broker) == 0


@trio_test
async def test_half_message_delivery_time_checked_at_send_and_held_after_commit():
    async with broker_with("TimerTx", timer_max_delay_s=MAX_DELAY_S) as (client, broker):
        executed: list[bytes] = []

        def execute_local(msg, _arg):
            executed.append(msg.body)
            return LocalTransactionState.COMMIT_MESSAGE

        async with TransactionProducer(client, "PG_TIMER_TX", execute_local=execute_local,
                                       check=lambda m: LocalTransactionState.COMMIT_MESSAGE) as p:
            # Too far ahead: refused at the half send, as a normal send (not stored, no
            # local transaction run, nothing to commit later).
            for props in ({"TIMER_DELIVER_MS": str(now_ms() + 2 * MAX_DELAY_S * 1000)},
                          {"TIMER_DELAY_SEC": "soon"}):
                with pytest.raises(MQBrokerError) as refused:
                    await p.send_in_transaction(Message("TimerTx", b"far", properties=props))
                assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
            assert executed == [] and broker.store.max_offset(TRANS_HALF_TOPIC, 0) == 0
            # A delay in range: the commit holds it until its time.
            sent = now_ms()
            await p.send_in_transaction(Message("TimerTx", b"tx", properties={
                "TIMER_DELAY_SEC": "2"}))
            assert executed == [b"tx"]
            (m,) = await arrived(client, "TimerTx", 1)
        assert m.body == b"tx" and m.store_timestamp >= sent + 2000
        assert scheduled(broker) >= 1


@pytest.mark.slow
def test_cpp_producer_timer_property_is_held(tmp_path):
    async def main():
        async with broker_with("TimerCpp") as (client, broker):
            namesrv = client.config.namesrv_addr
            events = await trio.to_thread.run_sync(lambda: b_run(
                "producer.py", "--namesrv", namesrv, "--group", "PID_TIMER",
                "--topic", "TimerCpp", "--count", "2", "--property", "TIMER_DELAY_SEC=2"))
            sent = [e for e in events if e["event"] == "sent"]
            assert len(sent) == 2, events
            assert scheduled(broker) >= 2
            got = await arrived(client, "TimerCpp", 2)
            assert sorted(m.body for m in got) == sorted(e["body"].encode() for e in sent)
            for m in got:
                assert m.store_timestamp - m.born_timestamp >= 2000

    trio.run(main)
