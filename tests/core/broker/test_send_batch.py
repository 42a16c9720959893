"""Batch sends (docs/protocol.md §7.7): the refusals, whichever path splits the body (the store
for plain batches, the processor when DELAY appears somewhere), and the stored layout."""

from __future__ import annotations

from core.common.codec import BatchItem, decode_records, encode_batch
from tests.core.broker.harness import batch_body, pull_request, run_embedded, send_request


async def _pull(client, addr, topic):
    resp = await client.invoke(addr, pull_request("CID_T", topic, 0, 0))
    assert resp.code == 0, (resp.code, resp.remark)
    return decode_records(resp.body_bytes())


def test_batch_refusals(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr

        async def send(raw, **kw):
            return await client.invoke(addr, send_request("BatchR", raw, code=320, **kw))

        ok = batch_body([(b"a", {"UNIQ_KEY": "U1"})])
        delayed = batch_body([(b"a", {"UNIQ_KEY": "U1"}), (b"b", {"DELAY": "3"})])
        resp = await send(delayed)
        assert (resp.code, resp.remark) == (13, "batch message does not support delay")
        resp = await send(ok, properties={"DELAY": "2"})
        assert (resp.code, resp.remark) == (13, "batch message does not support delay")
        for raw in (ok[:10], ok + ok[:25]):
            resp = await send(raw)
            assert resp.code == 13 and resp.remark.startswith("bad batch body: "), resp.remark
        resp = await send(b"")
        assert (resp.code, resp.remark) == (13, "empty batch")
        # A body that mentions DELAY in a payload (not a property) is stored.
        resp = await send(batch_body([(b"DELAY\x01x", {"UNIQ_KEY": "U2"})]))
        assert resp.code == 0
        resp = await send(ok, properties={"DELAY": "0"})
        assert resp.code == 0
        msgs = await _pull(client, addr, "BatchR")
        assert [m.body for m in msgs] == [b"DELAY\x01x", b"a"]

    run_embedded(body, tmp_path)


def test_batch_properties_are_the_producers_plus_the_brokers(tmp_path):
    async def body(server, client):
        addr = server.broker.broker_addr
        items = [
            BatchItem(0, b"cpp", "KEYS\x01k0\x02TAGS\x01TagB\x02UNIQ_KEY\x01U0\x02WAIT\x01true\x02"),
            BatchItem(5, b"java", "TAGS\x01TagC\x02WAIT\x01true\x02UNIQ_KEY\x01U1"),
        ]
        resp = await client.invoke(addr, send_request(
            "BatchP", encode_batch(items), code=10, batch="1", properties={"WAIT": "true"}))
        assert resp.code == 0, resp.remark
        a, b = await _pull(client, addr, "BatchP")
        assert a.properties == {"KEYS": "k0", "TAGS": "TagB", "UNIQ_KEY": "U0",
                                "CLUSTER": "DefaultCluster"}
        assert b.properties == {"TAGS": "TagC", "UNIQ_KEY": "U1", "CLUSTER": "DefaultCluster"}
        assert (a.flag, b.flag) == (0, 5)
        store = server.broker.store
        assert len(store.query_by_key("BatchP", "k0")) == 1
        assert len(store.query_by_uniq_key("BatchP", "U1")) == 1

    run_embedded(body, tmp_path)
