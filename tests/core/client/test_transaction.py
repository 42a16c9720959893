"""Transactional producer: commit, rollback, and an unknown outcome resolved by the
broker's back-check (CHECK_TRANSACTION_STATE -> END_TRANSACTION)."""

from __future__ import annotations

import time

import pytest
from trio.testing import trio_test, wait_all_tasks_blocked

from core.client import (
    ClientInstance,
    LocalTransactionState,
    Message,
    MQClientError,
    TransactionProducer,
)
from tests.core.client.cluster import cluster, wait_for
from tests.core.client.test_producer import pull_all

# A half message becomes checkable 2 s after it was stored: long enough that the one-way
# END_TRANSACTION of a decided transaction is always processed first, even on a loaded
# 2-core machine, and short enough to keep the test quick.
FAST_CHECKS = dict(transaction_timeout_s=2.0, transaction_check_interval_s=0.5)


@trio_test
async def test_commit_rollback_and_back_check():
    async with cluster(**FAST_CHECKS) as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxT", 2, 2)
        outcomes = {b"commit": "COMMIT_MESSAGE", b"rollback": LocalTransactionState.ROLLBACK_MESSAGE,
                    b"unknown": LocalTransactionState.UNKNOW, b"crash": None}
        checked: list[tuple[bytes, str]] = []

        async def execute_local(msg, arg):
            assert arg == "arg"
            if outcomes[msg.body] is None:
                raise RuntimeError("local transaction blew up")
            return outcomes[msg.body]

        def check(msg):
            checked.append((msg.body, msg.topic))
            return LocalTransactionState.COMMIT_MESSAGE if msg.body == b"unknown" else "ROLLBACK_MESSAGE"

        producer = TransactionProducer(client, "PG_TX", execute_local=execute_local, check=check)
        async with producer:
            results = {}
            for body in outcomes:
                r = await producer.send_in_transaction(Message("TxT", body), "arg")
                results[body] = r
            assert results[b"commit"].local_state is LocalTransactionState.COMMIT_MESSAGE
            assert results[b"crash"].local_state is LocalTransactionState.UNKNOW
            with pytest.raises(MQClientError):
                await producer.send_in_transaction(Message("TxT", b""))

            async def delivered():
                return sorted(m.body for m in await pull_all(client, "TxT")) == [b"commit", b"unknown"]
            await wait_for(delivered, timeout=20)
            await wait_for(lambda: {b for b, _ in checked} >= {b"unknown", b"crash"}, timeout=20)
            # A few more check passes, as if a minute had gone by (every half message is
            # due), each followed by an idle loop (broker and producer share this trio run,
            # the check callback runs inline): nothing else may be checked or appear.
            service = c.brokers[0].transaction_service
            for _ in range(3):
                await service.check_once(now_ms=int(time.time() * 1000) + 60_000)
                await wait_all_tasks_blocked()

        bodies = sorted(m.body for m in await pull_all(client, "TxT"))
        assert bodies == [b"commit", b"unknown"]
        assert all(topic == "TxT" for _, topic in checked)
        # Decided transactions are never checked.
        assert not {b for b, _ in checked} & {b"commit", b"rollback"}
