"""Batched transactional messages (core/broker/transaction_batch.py): a prepared batch send
is kept as one half message, and one ordinary END_TRANSACTION commits all its rows or none,
against a real broker over TCP."""

from __future__ import annotations

import time

from trio.testing import trio_test

from core.broker.transaction_batch import BATCH_HALF
from core.client import ClientInstance
from core.client.model import MessageQueue
from core.client.pull_consumer import broker_addr_for
from core.common.codec import BatchItem, encode_batch
from core.common.msgid import decode_offset_msg_id
from core.common.names import TRANS_HALF_TOPIC
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.client.cluster import cluster
from tests.core.client.test_producer import pull_all

GROUP = "PG_TXB"
UNIQ = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX


async def send_prepared(client, topic: str, qid: int, bodies: list[bytes], tag: str,
                        sys_flag: int = MessageSysFlag.TRANSACTION_PREPARED_TYPE,
                        body: bytes | None = None):
    """A prepared batch; returns (half offset, commit-log offset, row uniqs) or the refusal."""
    mq = MessageQueue(topic, "broker-a", qid)
    addr = await broker_addr_for(client, mq)
    uniqs = [f"{tag}{i:08X}".rjust(32, "0") for i in range(len(bodies))]
    if body is None:
        body = encode_batch([BatchItem(0, b, encode_properties({UNIQ: u}))
                             for b, u in zip(bodies, uniqs, strict=True)])
    ext = {"a": GROUP, "b": topic, "c": "TBW102", "d": "4", "e": str(qid), "f": str(sys_flag),
           "g": str(int(time.time() * 1000)), "h": "0", "j": "0", "k": "false", "m": "true",
           "i": encode_properties({MessageConst.PRODUCER_GROUP: GROUP, UNIQ: f"{tag}HALF",
                                   MessageConst.WAIT_STORE_MSG_OK: "true"})}
    resp = await client.api.invoke(addr, client.api._request(RequestCode.SEND_BATCH_MESSAGE,
                                                             ext, body))
    if resp.code != ResponseCode.SUCCESS:
        return resp
    return resp.ext_int("queueOffset"), decode_offset_msg_id(resp.ext_str("msgId"))[2], uniqs


async def end(client, half_offset: int, phys: int, commit: bool, group: str = GROUP):
    """An ordinary (Apache) END_TRANSACTION, answered."""
    addr = await broker_addr_for(client, MessageQueue("TxB", "broker-a", 0))
    ext = {"producerGroup": group, "tranStateTableOffset": str(half_offset),
           "commitLogOffset": str(phys), "fromTransactionCheck": "false",
           "commitOrRollback": str(MessageSysFlag.TRANSACTION_COMMIT_TYPE if commit
                                   else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)}
    return await client.api.invoke(addr, client.api._request(RequestCode.END_TRANSACTION, ext))


@trio_test
async def test_prepared_batch_is_one_half_committed_whole():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxB", 2, 2)
        store = c.brokers[0].store
        bodies = [f"row{i}".encode() for i in range(6)]
        half, phys, uniqs = await send_prepared(client, "TxB", 1, bodies, "A")
        rolled = await send_prepared(client, "TxB", 0, [b"gone1", b"gone2"], "B")
        assert store.max_offset(TRANS_HALF_TOPIC, 0) == 2     # one half per batch
        assert await pull_all(client, "TxB") == []           # invisible until committed

        assert (await end(client, half, phys, True, group="OTHER")).code \
            == ResponseCode.SYSTEM_ERROR
        assert (await end(client, half, phys, True)).code == ResponseCode.SUCCESS
        assert (await end(client, *rolled[:2], False)).code == ResponseCode.SUCCESS
        assert (await end(client, half, phys, True)).code == ResponseCode.SUCCESS  # again
        got = await pull_all(client, "TxB")
        assert [(m.queue_id, m.body, m.msg_id) for m in got] == \
            [(1, b, u) for b, u in zip(bodies, uniqs, strict=True)]   # once, in order
        for m in got:
            assert MessageConst.TRANSACTION_PREPARED not in m.properties
            assert BATCH_HALF not in m.properties
            assert m.properties[MessageConst.REAL_TOPIC] == "TxB"
            assert MessageSysFlag.transaction_value(m.sys_flag) \
                == MessageSysFlag.TRANSACTION_COMMIT_TYPE
        # each row is in the key index under its own UNIQ_KEY
        found = await client.api.query_message(c.broker_addrs[0], "TxB", uniqs[3], 32, 0, None,
                                               unique=True)
        assert [m.body for m in found] == [b"row3"]

        # the op records settled both: a check pass long after asks the producer nothing
        service = c.brokers[0].transaction_service
        assert await service.check_once(now_ms=int(time.time() * 1000) + 600_000) == 0
        assert (service.commits, service.rollbacks) == (1, 1)


@trio_test
async def test_bad_or_other_transactional_batches_are_refused():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxB", 1, 1)
        resp = await send_prepared(client, "TxB", 0, [b"x"], "C",
                                   sys_flag=MessageSysFlag.TRANSACTION_COMMIT_TYPE)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        good = encode_batch([BatchItem(0, b"x", "")])
        for bad in (good[:-3], good + b"\x00\x00", b""):
            resp = await send_prepared(client, "TxB", 0, [b"x"], "D", body=bad)
            assert resp.code == ResponseCode.MESSAGE_ILLEGAL, bad
        delayed = encode_batch([BatchItem(0, b"x", encode_properties(
            {MessageConst.DELAY_TIME_LEVEL: "2"}))])
        resp = await send_prepared(client, "TxB", 0, [b"x"], "E", body=delayed)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL and "delay" in resp.remark
        assert c.brokers[0].store.max_offset(TRANS_HALF_TOPIC, 0) == 0


@trio_test
async def test_a_client_cannot_mark_a_single_half_as_a_batch():
    """LMQ_TRAN_BATCH is the broker's: on a single prepared message it is dropped, so its
    body is committed as one message, never split as a batch."""
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxB", 1, 1)
        mq = MessageQueue("TxB", "broker-a", 0)
        addr = await broker_addr_for(client, mq)
        body = encode_batch([BatchItem(0, b"a", ""), BatchItem(0, b"b", "")])
        props = {MessageConst.PRODUCER_GROUP: GROUP, MessageConst.TRANSACTION_PREPARED: "true",
                 UNIQ: "F" * 32, BATCH_HALF: "2"}
        ext = {"a": GROUP, "b": "TxB", "c": "TBW102", "d": "4", "e": "0",
               "f": str(MessageSysFlag.TRANSACTION_PREPARED_TYPE),
               "g": str(int(time.time() * 1000)), "h": "0", "j": "0", "k": "false",
               "m": "false", "i": encode_properties(props)}
        resp = await client.api.invoke(addr, client.api._request(RequestCode.SEND_MESSAGE_V2,
                                                                 ext, body))
        assert resp.code == ResponseCode.SUCCESS
        phys = decode_offset_msg_id(resp.ext_str("msgId"))[2]
        assert (await end(client, resp.ext_int("queueOffset"), phys, True)).code \
            == ResponseCode.SUCCESS
        got = await pull_all(client, "TxB")
        assert [m.body for m in got] == [body] and BATCH_HALF not in got[0].properties
