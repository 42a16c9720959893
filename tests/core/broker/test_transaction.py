"""Transactional messages (docs/protocol.md §9.4, §5.12, §5.13): half messages, commit,
rollback, back-checks answered by the producer, the check limit, and kill -9.

The wheel has no transactional producer (docs/protocol.md §0), so the producer side is a RemotingClient
sending raw SEND_MESSAGE (TRAN_MSG/PGROUP) and END_TRANSACTION, and answering
CHECK_TRANSACTION_STATE from its own ProcessorTable; results are read back with the
real C++ pull consumer where a whole process is involved.
"""

from __future__ import annotations

import json
import time

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from core.common.codec import decode_record
from core.common.msgid import decode_offset_msg_id
from core.common.names import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from core.common.sysflag import MessageSysFlag
from core.remoting import ProcessorTable, RemotingClient, RequestCode, ResponseCode
from tests.core.broker.b_harness import cpp_pull_all, messages, request, toml_config, wait_async
from tests.core.broker.harness import (
    ServerProcess,
    heartbeat_request,
    run_embedded,
    send_request,
)

COMMIT = MessageSysFlag.TRANSACTION_COMMIT_TYPE
ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
UNKNOWN = MessageSysFlag.TRANSACTION_NOT_TYPE
GROUP = "PID_TX"

# Checks come fast in these brokers: timeout 0.3 s, a pass every 0.2 s.
FAST_CHECKS = {"transaction_timeout_s": 0.3, "transaction_check_interval_s": 0.2}


async def later_passes(server, passes=3, ahead_s=60):
    """Run check passes as if `ahead_s` seconds had gone by (every timeout is over), then
    wait until the checks they sent and the producer's answers have been handled (client
    and broker share this trio loop). Stands in for "sleep and let more passes run"."""
    service = server.broker.transaction_service
    for _ in range(passes):
        await service.check_once(now_ms=int(time.time() * 1000) + ahead_s * 1000)
        await wait_all_tasks_blocked()


async def send_half(client, addr, topic, body, uniq, group=GROUP):
    """A prepared message as a transactional producer sends it; returns
    (tranStateTableOffset, commitLogOffset)."""
    resp = await client.invoke(addr, send_request(
        topic, body, group=group, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
        properties={"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq, "TAGS": "tx"}))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    _ip, _port, phys = decode_offset_msg_id(resp.ext_fields["msgId"])
    return int(resp.ext_fields["queueOffset"]), phys


def end_tx(table_offset, phys, decision, group=GROUP, from_check=False, msg_id=""):
    return request(
        RequestCode.END_TRANSACTION, producerGroup=group, tranStateTableOffset=table_offset,
        commitLogOffset=phys, commitOrRollback=decision,
        fromTransactionCheck="true" if from_check else "false", msgId=msg_id,
    )


def answering_producer(decide, log):
    """A ProcessorTable that answers CHECK_TRANSACTION_STATE with `decide(check)` (a
    commitOrRollback value, or None to stay silent) and records every check."""
    table = ProcessorTable()

    async def on_check(ctx, cmd):
        log.append(cmd)
        decision = decide(cmd)
        if decision is not None:
            ext = cmd.ext_fields
            await ctx.connection.invoke_oneway(end_tx(
                ext["tranStateTableOffset"], ext["commitLogOffset"], decision,
                from_check=True, msg_id=ext["msgId"]))
        return None

    table.register(RequestCode.CHECK_TRANSACTION_STATE, on_check)
    return table


def test_half_message_is_invisible_until_commit(tmp_path):
    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        table_offset, phys = await send_half(client, addr, "TxT", b"order-1", "TX-1")
        assert broker.store.max_offset("TxT", 0) == 0
        half = broker.store.look_message(phys)
        assert half.topic == TRANS_HALF_TOPIC and half.queue_id == 0
        assert half.queue_offset == table_offset
        assert half.properties["REAL_TOPIC"] == "TxT"
        assert half.properties["REAL_QID"] == "0"
        assert MessageSysFlag.transaction_value(half.sys_flag) == UNKNOWN

        resp = await client.invoke(addr, end_tx(table_offset, phys, COMMIT))
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        got = await messages(client, addr, "TxT")
        assert [m.body for m in got] == [b"order-1"]
        msg = got[0]
        assert MessageSysFlag.transaction_value(msg.sys_flag) == COMMIT
        assert msg.prepared_transaction_offset == phys
        assert "TRAN_MSG" not in msg.properties
        assert msg.properties["PGROUP"] == GROUP and msg.properties["UNIQ_KEY"] == "TX-1"

        ops = await wait_async(lambda: messages(client, addr, TRANS_OP_HALF_TOPIC), 5, "op")
        assert [(m.body, m.properties["TAGS"]) for m in ops] == [
            (str(table_offset).encode(), "d")
        ]

    run_embedded(body, tmp_path)


def test_rollback_stores_nothing_and_later_decisions_are_ignored(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        table_offset, phys = await send_half(client, addr, "TxR", b"cancelled", "TX-R")
        resp = await client.invoke(addr, end_tx(table_offset, phys, ROLLBACK))
        assert resp.code == ResponseCode.SUCCESS
        assert await messages(client, addr, "TxR") == []
        assert len(await messages(client, addr, TRANS_OP_HALF_TOPIC)) == 1
        # A commit arriving after the rollback does not resurrect the message.
        resp = await client.invoke(addr, end_tx(table_offset, phys, COMMIT))
        assert resp.code == ResponseCode.SUCCESS
        assert await messages(client, addr, "TxR") == []

    run_embedded(body, tmp_path)


def test_end_transaction_is_checked(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        table_offset, phys = await send_half(client, addr, "TxC", b"x", "TX-C")

        async def remark_of(cmd):
            resp = await client.invoke(addr, cmd)
            assert resp.code == ResponseCode.SYSTEM_ERROR
            return resp.remark

        assert await remark_of(end_tx(table_offset, phys, COMMIT, group="PID_OTHER")) == (
            "The producer group wrong")
        assert await remark_of(end_tx(table_offset + 5, phys, COMMIT)) == (
            "The transaction state table offset wrong")
        assert await remark_of(end_tx(0, 10**12, COMMIT)) == (
            "Find prepared transaction message failed")
        # A normal message is not a half message.
        normal = await client.invoke(addr, send_request("TxC", b"plain"))
        _ip, _port, normal_phys = decode_offset_msg_id(normal.ext_fields["msgId"])
        assert await remark_of(end_tx(0, normal_phys, COMMIT)) == (
            "Find prepared transaction message failed")
        resp = await client.invoke(addr, request(RequestCode.END_TRANSACTION, producerGroup=GROUP))
        assert resp.code == ResponseCode.SYSTEM_ERROR  # required fields missing

        # "Unknown" changes nothing and is not answered (one-way from producers).
        await client.invoke_oneway(addr, end_tx(table_offset, phys, UNKNOWN))
        await wait_all_tasks_blocked()  # the broker has read and handled it
        assert [m.body for m in await messages(client, addr, "TxC")] == [b"plain"]
        assert await messages(client, addr, TRANS_OP_HALF_TOPIC) == []

    run_embedded(body, tmp_path)


def test_back_check_resolves_commit_and_rollback(tmp_path):
    checks = []

    def decide(cmd):
        return COMMIT if cmd.ext_fields["msgId"] == "TX-YES" else ROLLBACK

    async def body(server, client):
        broker = server.broker
        addr = broker.broker_addr
        resp = await client.invoke(addr, heartbeat_request("producer-1", producers=[GROUP]))
        assert resp.code == ResponseCode.SUCCESS
        yes_offset, yes_phys = await send_half(client, addr, "TxB", b"yes", "TX-YES")
        await send_half(client, addr, "TxB", b"no", "TX-NO")

        got = await wait_async(lambda: messages(client, addr, "TxB"), 10, "the commit")
        assert [m.body for m in got] == [b"yes"]
        await wait_async(lambda: len(checks) >= 2, 10, "both checks")

        # More check passes, late enough for any timeout: both are resolved, nothing is
        # asked again.
        await later_passes(server)
        assert sorted(c.ext_fields["msgId"] for c in checks) == ["TX-NO", "TX-YES"]
        assert [m.body for m in await messages(client, addr, "TxB")] == [b"yes"]

        check = next(c for c in checks if c.ext_fields["msgId"] == "TX-YES")
        ext = check.ext_fields
        assert ext["transactionId"] == "TX-YES"
        # The check names a new copy of the half message (stored again with the counter).
        assert int(ext["tranStateTableOffset"]) > yes_offset
        assert int(ext["commitLogOffset"]) != yes_phys
        assert decode_offset_msg_id(ext["offsetMsgId"])[2] == int(ext["commitLogOffset"])
        record = decode_record(check.body_bytes())
        assert record.topic == "TxB" and record.queue_id == 0  # real destination
        assert record.body == b"yes"
        assert record.commitlog_offset == int(ext["commitLogOffset"])
        assert record.queue_offset == int(ext["tranStateTableOffset"])
        assert record.properties["TRANSACTION_CHECK_TIMES"] == "1"

        path = tmp_path / "data" / "config" / "transactionCheckOffset.json"
        saved = json.loads(path.read_text())
        assert saved["halfOffset"]["0"] == broker.store.max_offset(TRANS_HALF_TOPIC, 0)

    run_embedded(body, tmp_path, processors=answering_producer(decide, checks), **FAST_CHECKS)


def test_unresolved_half_moves_to_check_max_topic(tmp_path):
    checks = []

    async def body(server, client):
        addr = server.broker.broker_addr
        await client.invoke(addr, heartbeat_request("producer-2", producers=[GROUP]))
        await send_half(client, addr, "TxU", b"undecided", "TX-U")
        moved = await wait_async(
            lambda: messages(client, addr, TRANS_CHECK_MAX_TIME_TOPIC), 15, "the move"
        )
        assert [m.body for m in moved] == [b"undecided"]
        assert moved[0].properties["REAL_TOPIC"] == "TxU"
        await later_passes(server)
        # Checked exactly transaction_check_max (2) times, with a rising counter.
        assert [c.ext_fields["msgId"] for c in checks] == ["TX-U", "TX-U"]
        assert [decode_record(c.body_bytes()).properties["TRANSACTION_CHECK_TIMES"]
                for c in checks] == ["1", "2"]
        assert await messages(client, addr, "TxU") == []

    run_embedded(body, tmp_path, processors=answering_producer(lambda cmd: None, checks),
                 transaction_check_max=2, **FAST_CHECKS)


def test_long_immunity_does_not_hold_up_other_checks(tmp_path):
    checks = []

    async def body(server, client):
        addr = server.broker.broker_addr
        await client.invoke(addr, heartbeat_request("producer-3", producers=[GROUP]))
        resp = await client.invoke(addr, send_request(
            "TxI", b"immune", group=GROUP, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            properties={"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": "TX-IMMUNE",
                        "CHECK_IMMUNITY_TIME_IN_SECONDS": "3600"}))
        assert resp.code == 0
        await send_half(client, addr, "TxI", b"normal", "TX-NORMAL")
        await wait_async(lambda: messages(client, addr, "TxI"), 10, "the normal commit")
        await later_passes(server)  # a minute on: still well inside the hour's immunity
        assert [c.ext_fields["msgId"] for c in checks] == ["TX-NORMAL"]

    run_embedded(body, tmp_path, processors=answering_producer(lambda cmd: COMMIT, checks),
                 **FAST_CHECKS)


def test_no_live_producer_means_no_check_sent(tmp_path):
    async def body(server, client):
        service = server.broker.transaction_service
        addr = server.broker.broker_addr
        await send_half(client, addr, "TxN", b"orphan", "TX-N")
        await wait_async(lambda: messages(client, addr, TRANS_CHECK_MAX_TIME_TOPIC), 15,
                         "the move")
        # The mover counts after its put returns (which may wait for the new topic's write).
        await wait_async(lambda: service.discarded == 1, 10, "the discard count")
        assert service.checks_sent == 0

    run_embedded(body, tmp_path, transaction_check_max=1, **FAST_CHECKS)


@pytest.mark.slow
def test_transactions_survive_kill_9(tmp_path):
    """Committed and rolled-back transactions stay settled across kill -9; a pending one
    is checked after the restart and its commit reaches the C++ consumer."""
    data = tmp_path / "data"
    # Checks only after 2 s: the pending transaction is not checked before the kill.
    config = toml_config(transaction_timeout_s=2.0, transaction_check_interval_s=0.3)
    server = ServerProcess(data, config_text=config).start()

    async def before():
        async with RemotingClient(request_timeout=10.0) as client:
            addr = server.broker_addr
            off, phys = await send_half(client, addr, "TxKill", b"committed", "TX-K1")
            assert (await client.invoke(addr, end_tx(off, phys, COMMIT))).code == 0
            off, phys = await send_half(client, addr, "TxKill", b"rolled-back", "TX-K2")
            assert (await client.invoke(addr, end_tx(off, phys, ROLLBACK))).code == 0
            await send_half(client, addr, "TxKill", b"pending", "TX-K3")

    try:
        trio.run(before)
    finally:
        server.kill()

    again = ServerProcess(data, namesrv_port=server.namesrv_port,
                          broker_port=server.broker_port, config_text=config).start()
    checks = []

    async def after():
        table = answering_producer(lambda cmd: COMMIT, checks)
        async with RemotingClient(request_timeout=10.0, processors=table) as client:
            addr = again.broker_addr
            resp = await client.invoke(addr, heartbeat_request("producer-k", producers=[GROUP]))
            assert resp.code == 0
            await wait_async(lambda: len(checks) >= 1, 20, "the check after restart")
            await wait_async(
                lambda: _count(messages(client, addr, "TxKill"), 2), 10, "the commit"
            )
            await trio.sleep(1.0)  # more passes: nothing else is checked

    try:
        trio.run(after)
        assert [c.ext_fields["msgId"] for c in checks] == ["TX-K3"]
        seen = cpp_pull_all(again.namesrv_addr, "TxKill")
        assert sorted(e["body"] for e in seen) == ["committed", "pending"]
    finally:
        again.kill()


async def _count(coro, n):
    return len(await coro) >= n
