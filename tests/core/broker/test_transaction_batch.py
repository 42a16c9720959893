"""Batched transactional messages (core/broker/transaction_batch.py): a prepared batch send
stores half messages, END_TRANSACTION with ``halfCount`` ends them all at once, against a
real broker over TCP."""

from __future__ import annotations

import time

from trio.testing import trio_test

from core.client import ClientInstance
from core.client.model import MessageQueue
from core.client.pull_consumer import broker_addr_for
from core.common.codec import BatchItem, encode_batch
from core.common.msgid import decode_offset_msg_id
from core.common.properties import MessageConst, encode_properties
from core.common.sysflag import MessageSysFlag
from core.remoting.codes import RequestCode, ResponseCode
from tests.core.client.cluster import cluster
from tests.core.client.test_producer import pull_all

GROUP = "PG_TXB"


async def send_prepared(client, topic: str, qid: int, bodies: list[bytes], tag: str,
                        sys_flag: int = MessageSysFlag.TRANSACTION_PREPARED_TYPE):
    """A prepared batch; returns (half offset of the first, its commit-log offset, uniqs)."""
    mq = MessageQueue(topic, "broker-a", qid)
    addr = await broker_addr_for(client, mq)
    uniqs = [f"{tag}{i:08X}".rjust(32, "0") for i in range(len(bodies))]
    body = encode_batch([BatchItem(0, b, encode_properties({MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: u}))
                         for b, u in zip(bodies, uniqs, strict=True)])
    ext = {"a": GROUP, "b": topic, "c": "TBW102", "d": "4", "e": str(qid), "f": str(sys_flag),
           "g": str(int(time.time() * 1000)), "h": "0", "j": "0", "k": "false", "m": "true",
           "i": encode_properties({MessageConst.PRODUCER_GROUP: GROUP,
                                   MessageConst.WAIT_STORE_MSG_OK: "true"})}
    resp = await client.api.invoke(addr, client.api._request(RequestCode.SEND_BATCH_MESSAGE,
                                                             ext, body))
    if resp.code != ResponseCode.SUCCESS:
        return resp
    ids = resp.ext_str("msgId").split(",")
    assert len(ids) == len(bodies)
    return resp.ext_int("queueOffset"), decode_offset_msg_id(ids[0])[2], uniqs


async def end(client, first: int, phys: int, count: int, commit: bool, group: str = GROUP):
    addr = await broker_addr_for(client, MessageQueue("TxB", "broker-a", 0))
    ext = {"producerGroup": group, "tranStateTableOffset": str(first),
           "commitLogOffset": str(phys), "fromTransactionCheck": "false",
           "commitOrRollback": str(MessageSysFlag.TRANSACTION_COMMIT_TYPE if commit
                                   else MessageSysFlag.TRANSACTION_ROLLBACK_TYPE),
           "halfCount": str(count)}
    return await client.api.invoke(addr, client.api._request(RequestCode.END_TRANSACTION, ext))


@trio_test
async def test_prepared_batch_is_invisible_until_one_batched_commit():
    async with cluster(transaction_end_batch_max=8) as c, \
            ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxB", 2, 2)
        bodies = [f"row{i}".encode() for i in range(6)]
        first, phys, uniqs = await send_prepared(client, "TxB", 1, bodies, "A")
        rolled = await send_prepared(client, "TxB", 0, [b"gone1", b"gone2"], "B")
        assert await pull_all(client, "TxB") == []           # halves are invisible

        # wrong group, wrong first offset, too many: refused, nothing stored
        assert (await end(client, first, phys, 6, True, group="OTHER")).code \
            == ResponseCode.SYSTEM_ERROR
        assert (await end(client, first, phys + 1, 6, True)).code == ResponseCode.SYSTEM_ERROR
        big = await end(client, first, phys, 9, True)
        assert big.code == ResponseCode.MESSAGE_ILLEGAL and "transaction_end_batch_max" in big.remark
        assert await pull_all(client, "TxB") == []

        assert (await end(client, first, phys, 6, True)).code == ResponseCode.SUCCESS
        assert (await end(client, *rolled[:2], 2, False)).code == ResponseCode.SUCCESS
        assert (await end(client, first, phys, 6, True)).code == ResponseCode.SUCCESS  # again
        got = await pull_all(client, "TxB")
        assert [(m.queue_id, m.body, m.msg_id) for m in got] == \
            [(1, b, u) for b, u in zip(bodies, uniqs, strict=True)]   # once, in order
        assert all(MessageConst.TRANSACTION_PREPARED not in m.properties for m in got)

        # one op record settled them all: a check pass long after asks the producer nothing
        service = c.brokers[0].transaction_service
        assert await service.check_once(now_ms=int(time.time() * 1000) + 600_000) == 0
        assert (service.commits, service.rollbacks) == (6, 2)


@trio_test
async def test_other_transactional_batches_are_still_refused():
    async with cluster() as c, ClientInstance(namesrv_addr=c.namesrv_addr) as client:
        await client.api.create_topic(c.broker_addrs[0], "TxB", 1, 1)
        resp = await send_prepared(client, "TxB", 0, [b"x"], "C",
                                   sys_flag=MessageSysFlag.TRANSACTION_COMMIT_TYPE)
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL
        assert await pull_all(client, "TxB") == []
