"""Queue locks of orderly consumers: LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (docs/protocol.md §5.11)."""

from __future__ import annotations

import json
import time

import pytest

from core.broker.lock_manager import MessageQueue, RebalanceLockManager
from core.remoting import RequestCode, ResponseCode
from tests.core.broker.b_harness import (
    b_driver,
    cpp_produce,
    prepare_consumer_topics,
    request,
)
from tests.core.broker.harness import ServerProcess, run_embedded, sync_invoke


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mq(q: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "broker-a", q)


def test_lock_owner_renewal_expiry_and_unlock():
    clock = FakeClock()
    locks = RebalanceLockManager(lock_max_live_s=60.0, clock=clock)
    assert locks.try_lock_batch("G", [mq(0), mq(1)], "c1") == [mq(0), mq(1)]
    # Another client gets only what is free.
    assert locks.try_lock_batch("G", [mq(1), mq(2)], "c2") == [mq(2)]
    # Other groups are independent.
    assert locks.try_lock_batch("G2", [mq(1)], "c2") == [mq(1)]
    assert locks.owner("G", mq(1)) == "c1"
    assert locks.is_locked("G", mq(0), "c1") and not locks.is_locked("G", mq(0), "c2")

    clock.now += 50
    assert locks.try_lock_batch("G", [mq(0)], "c1") == [mq(0)]  # renewed at +50
    clock.now += 20  # mq(1) last renewed 70 s ago: expired; mq(0) 20 s ago: alive
    assert locks.try_lock_batch("G", [mq(0), mq(1)], "c2") == [mq(1)]
    assert locks.owner("G", mq(1)) == "c2"

    # Only the owner can unlock.
    locks.unlock_batch("G", [mq(0)], "c2")
    assert locks.owner("G", mq(0)) == "c1"
    locks.unlock_batch("G", [mq(0)], "c1")
    assert locks.owner("G", mq(0)) is None

    clock.now += 1000  # everything expired: purge frees the memory
    remaining = locks.lock_count()
    assert remaining == 3
    assert locks.purge_expired() == remaining
    assert locks.lock_count() == 0


def test_duplicate_queues_in_one_request_count_once():
    locks = RebalanceLockManager(lock_max_live_s=60.0)
    assert locks.try_lock_batch("G", [mq(3), mq(3)], "c1") == [mq(3)]


def _body(group, client_id, queues):
    return json.dumps({"consumerGroup": group, "clientId": client_id,
                       "mqSet": [q.to_json() for q in queues]}).encode()


def _locked(resp):
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return {MessageQueue.from_json(d) for d in json.loads(resp.body_bytes())["lockOKMQSet"]}


def test_lock_and_unlock_requests(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        # The broker's lock table reads time through its clock: shift it instead of sleeping.
        locks = server.broker.lock_manager
        shift = [0.0]
        locks._clock = lambda: time.monotonic() + shift[0]
        lock, unlock = RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ
        got = _locked(await client.invoke(addr, request(lock, _body("G", "c1", [mq(0), mq(1)]))))
        assert got == {mq(0), mq(1)}
        got = _locked(await client.invoke(addr, request(lock, _body("G", "c2", [mq(1), mq(2)]))))
        assert got == {mq(2)}
        resp = await client.invoke(addr, request(unlock, _body("G", "c1", [mq(1)])))
        assert resp.code == ResponseCode.SUCCESS and resp.body is None
        got = _locked(await client.invoke(addr, request(lock, _body("G", "c2", [mq(1)]))))
        assert got == {mq(1)}
        # An empty set is fine; the answer is an empty list.
        assert _locked(await client.invoke(addr, request(lock, _body("G", "c3", [])))) == set()

        # Expiry: c1's queue 0 is held until lock_max_live_s has passed, then free.
        shift[0] = locks.lock_max_live_s - 1
        assert _locked(await client.invoke(addr, request(lock, _body("G", "c3", [mq(0)])))) == set()
        shift[0] = locks.lock_max_live_s + 1
        got = _locked(await client.invoke(addr, request(lock, _body("G", "c3", [mq(0)]))))
        assert got == {mq(0)}

    run_embedded(body, tmp_path)


@pytest.mark.parametrize("raw", [
    b"", b"not json", b"[]", b'{"clientId":"c","mqSet":[]}',
    b'{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T"}]}',
    b'{"consumerGroup":"G","clientId":"c","mqSet":{"a":1}}',
])
def test_bad_lock_bodies_get_system_error(tmp_path, raw):
    async def body(server, client):
        addr = server.broker.broker_addr
        for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
            resp = await client.invoke(addr, request(code, raw))
            assert resp.code == ResponseCode.SYSTEM_ERROR

    run_embedded(body, tmp_path)


@pytest.mark.slow
def test_cpp_orderly_consumer_locks_its_queues(tmp_path):
    with ServerProcess(tmp_path / "data") as server:
        prepare_consumer_topics(server, "OrderT", "CID_ORDER")
        queues = [MessageQueue("OrderT", "broker-a", q) for q in range(4)]
        consumer = b_driver("push_consumer.py", "--namesrv", server.namesrv_addr,
                            "--group", "CID_ORDER", "--topic", "OrderT", "--orderly",
                            "--max-seconds", "90")
        try:
            consumer.wait_for(lambda ev: any(e["event"] == "started" for e in ev), 30)
            sent = cpp_produce(server.namesrv_addr, "OrderT", 12, prefix="o")
            consumer.wait_for(lambda ev: sum(e["event"] == "msg" for e in ev) >= 12, 60,
                              "orderly consumption")
            # Each queue is held by the C++ consumer: another client gets none of them.
            resp = sync_invoke(server.broker_addr, request(
                RequestCode.LOCK_BATCH_MQ, _body("CID_ORDER", "intruder", queues)))
            assert _locked(resp) == set()
        finally:
            events = consumer.close()
        # Shutdown sent UNLOCK_BATCH_MQ: the queues are free again.
        resp = sync_invoke(server.broker_addr, request(
            RequestCode.LOCK_BATCH_MQ, _body("CID_ORDER", "intruder", queues)))
        assert _locked(resp) == set(queues)
    got = [e for e in events if e["event"] == "msg"]
    assert sorted(e["body"] for e in got) == sorted(e["body"] for e in sent)
    for q in range(4):
        offsets = [e["queue_offset"] for e in got if e["queue_id"] == q]
        assert offsets == sorted(offsets)  # in queue order
