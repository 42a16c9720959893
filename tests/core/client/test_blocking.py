"""The blocking face: a client on a background thread, used from plain code.

The cluster runs in its own thread here (a trio run of its own), as a real broker would be
another process; the test body is ordinary blocking code.
"""

from __future__ import annotations

import time

import pytest
import trio

from core.client import ConsumeStatus, LocalTransactionState, Message, MessageQueue, PullStatus
from core.client.blocking import BlockingClient


@pytest.fixture(scope="module")
def namesrv(threaded_cluster):
    return threaded_cluster


def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_blocking_produce_and_push_consume(namesrv):
    with BlockingClient(namesrv["addr"]) as client:
        admin = client.admin()
        admin.topic_create("BlockPushT", read_queue_nums=2, write_queue_nums=2)
        got = []

        def listener(msgs, ctx):
            got.extend(m.body for m in msgs)
            return ConsumeStatus.SUCCESS

        consumer = client.push_consumer("CG_BLOCK_PUSH", listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("BlockPushT", "*")
        with consumer, client.producer("PG_BLOCK") as producer:
            r = producer.send(Message("BlockPushT", b"sync"))
            assert r.status.name == "SEND_OK"
            fut = producer.send_async(Message("BlockPushT", b"async"))
            assert fut.result(10).status.name == "SEND_OK"
            producer.send_oneway(Message("BlockPushT", b"oneway"))
            producer.send_batch([Message("BlockPushT", b"b1"), Message("BlockPushT", b"b2")])
            wait_until(lambda: len(got) >= 5)
        assert sorted(got) == [b"async", b"b1", b"b2", b"oneway", b"sync"]


def test_blocking_pull_lite_pull_and_transactions(namesrv):
    client = BlockingClient.shared(namesrv["addr"])
    assert BlockingClient.shared(namesrv["addr"]) is client  # one per name-server set
    client.close()
    try:
        client.admin().topic_create("BlockPullT", read_queue_nums=1, write_queue_nums=1)
        tx = client.transaction_producer(
            "PG_BLOCK_TX", execute_local=lambda msg, arg: LocalTransactionState.COMMIT_MESSAGE,
            check=lambda msg: LocalTransactionState.ROLLBACK_MESSAGE)
        with tx:
            for i in range(3):
                result = tx.send_in_transaction(Message("BlockPullT", b"t%d" % i))
                assert result.local_state is LocalTransactionState.COMMIT_MESSAGE

        pc = client.pull_consumer("CG_BLOCK_PULL")
        mq = MessageQueue("BlockPullT", "broker-a", 0)
        deadline = time.monotonic() + 10
        while True:
            r = pc.pull(mq, "*", 0, 32)
            if r.status is PullStatus.FOUND and len(r.messages) == 3:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [m.body for m in r.messages] == [b"t0", b"t1", b"t2"]

        lite = client.lite_pull_consumer("CG_BLOCK_LITE", consume_from_where="FIRST_OFFSET")
        lite.subscribe("BlockPullT")
        with lite:
            polled = []
            while len(polled) < 3:
                polled.extend(lite.poll(10))
            lite.commit()
        assert [m.body for m in polled] == [b"t0", b"t1", b"t2"]
    finally:
        client.close()
    with pytest.raises(RuntimeError):
        client.call(trio.sleep, 0)
