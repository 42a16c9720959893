"""PopClient against hand-built broker answers: receipt handles are built from the
response header as Apache's client builds them (queue, LMQ), a POP_CK the broker set is
kept, and "nothing found" codes map to NO_NEW_MSG."""

from __future__ import annotations

import trio

from core.client.pop_consumer import PopClient, PopStatus
from core.common.codec import encode_host, encode_record
from core.common.properties import encode_properties
from core.remoting.codec import RemotingCommand


def record(topic: str, queue_id: int, queue_offset: int, props: dict, reconsume: int = 0):
    return encode_record(
        topic=topic.encode(), body=b"b%d" % queue_offset,
        properties=encode_properties(props).encode(), queue_id=queue_id, flag=0,
        queue_offset=queue_offset, physical_offset=1000 + queue_offset, sys_flag=0,
        born_timestamp=1, born_host=encode_host("127.0.0.1:1"), store_timestamp=2,
        store_host=encode_host("127.0.0.1:2"), reconsume_times=reconsume,
        prepared_transaction_offset=0)


class FakeClient:
    def __init__(self, response: RemotingCommand) -> None:
        self.response = response
        self.sent: list[RemotingCommand] = []

    async def invoke(self, addr, cmd, timeout=None):
        self.sent.append(cmd)
        return self.response


def pop_with(response, topic):
    fake = FakeClient(response)
    pc = PopClient(fake, "127.0.0.1:1", "broker-b", "GID")
    return trio.run(lambda: pc.pop(topic, invisible_ms=5000)), fake


def test_handles_built_from_header_and_kept_when_set():
    kept = "7 99 5000 0 0 broker-b 2 9"
    body = (record("T", 2, 8, {"TAGS": "a"}) + record("T", 2, 9, {"POP_CK": kept}, 1)
            + record("T", 3, 4, {}))
    resp = RemotingCommand.response(0, None, {
        "popTime": "1234", "invisibleTime": "5000", "reviveQid": "0", "restNum": "6",
        "startOffsetInfo": "0 2 7;0 3 4", "msgOffsetInfo": "0 2 8,9;0 3 4"}, body)
    result, fake = pop_with(resp, "T")
    assert result.status == PopStatus.FOUND and result.rest_num == 6
    assert [m.handle for m in result.messages] == [
        "7 1234 5000 0 0 broker-b 2 8", kept, "4 1234 5000 0 0 broker-b 3 4"]
    assert [m.delivery_count for m in result.messages] == [1, 2, 1]
    assert fake.sent[0].ext_fields["queueId"] == "-1"
    assert fake.sent[0].ext_fields["invisibleTime"] == "5000"


def test_lmq_handles_use_queue_0_and_the_lmq_offset():
    props = {"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "5,11"}
    resp = RemotingCommand.response(0, None, {
        "popTime": "77", "invisibleTime": "5000", "reviveQid": "0", "restNum": "0",
        "startOffsetInfo": "0 0 11", "msgOffsetInfo": "0 0 11"}, record("Src", 3, 40, props))
    result, _ = pop_with(resp, "%LMQ%b")
    (m,) = result.messages
    assert (m.topic, m.queue_id, m.queue_offset) == ("%LMQ%b", 0, 11)
    assert m.handle == "11 77 5000 0 0 broker-b 0 11"


def test_nothing_found_codes():
    for code in (210, 19):
        result, _ = pop_with(RemotingCommand.response(code, None, {"restNum": "0"}), "T")
        assert result.status == PopStatus.NO_NEW_MSG and result.messages == []
    result, _ = pop_with(RemotingCommand.response(209, None, {}), "T")
    assert result.status == PopStatus.POLLING_FULL


def light_pop(response, topic):
    pc = PopClient(FakeClient(response), "127.0.0.1:1", "broker-b", "GID")
    return trio.run(lambda: pc.pop(topic, invisible_ms=5000, light=True))


def test_light_pop_agrees_with_the_full_decode():
    kept = "7 99 5000 0 0 broker-b 2 9"
    body = (record("T", 2, 8, {"TAGS": "a"}) + record("T", 2, 9, {"POP_CK": kept}, 1)
            + record("T", 3, 4, {"K": "v"}))
    ext = {"popTime": "1234", "invisibleTime": "5000", "reviveQid": "0", "restNum": "6",
           "startOffsetInfo": "0 2 7;0 3 4", "msgOffsetInfo": "0 2 8,9;0 3 4"}
    full, _ = pop_with(RemotingCommand.response(0, None, dict(ext), body), "T")
    light = light_pop(RemotingCommand.response(0, None, dict(ext), body), "T")
    assert light.rest_num == 6 and len(light.messages) == 3
    for a, b in zip(full.messages, light.messages, strict=True):
        assert (b.handle, b.queue_id, b.queue_offset, b.body, b.delivery_count) == (
            a.handle, a.queue_id, a.queue_offset, a.body, a.delivery_count)
        assert b.message.store_timestamp == 2
        for key in ("TAGS", "K"):
            assert b.message.properties.get(key) == a.message.properties.get(key)
    assert [m.redelivered for m in light.messages] == [False, True, False]


def test_light_pop_lmq_offsets_from_the_header_and_inflated_bodies():
    import zlib

    props = {"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "5,11"}
    raw = bytearray(record("Src", 3, 40, props))
    z = encode_record(
        topic=b"Src", body=zlib.compress(b"x" * 300), properties=encode_properties(props).encode(),
        queue_id=3, flag=0, queue_offset=41, physical_offset=2000, sys_flag=1, born_timestamp=1,
        born_host=encode_host("127.0.0.1:1"), store_timestamp=3,
        store_host=encode_host("127.0.0.1:2"), reconsume_times=0, prepared_transaction_offset=0)
    resp = RemotingCommand.response(0, None, {
        "popTime": "77", "invisibleTime": "5000", "reviveQid": "0", "restNum": "0",
        "startOffsetInfo": "0 0 11", "msgOffsetInfo": "0 0 11,12"}, bytes(raw) + z)
    a, b = light_pop(resp, "%LMQ%b").messages
    assert (a.topic, a.queue_id, a.queue_offset, b.queue_offset) == ("%LMQ%b", 0, 11, 12)
    assert a.handle == "11 77 5000 0 0 broker-b 0 11"
    assert b.body == b"x" * 300 and b.message.sys_flag & 1 == 0


def test_light_pop_without_usable_offset_info_reads_the_records():
    props = {"INNER_MULTI_DISPATCH": "%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "11"}
    for info in (None, "0 0 11,12", "1 0 11", "0 0 x"):
        ext = {"popTime": "77", "invisibleTime": "5000", "reviveQid": "0", "restNum": "0",
               "startOffsetInfo": "0 0 11"}
        if info is not None:
            ext["msgOffsetInfo"] = info
        (m,) = light_pop(RemotingCommand.response(0, None, ext, record("Src", 3, 40, props)),
                         "%LMQ%b").messages
        assert (m.queue_id, m.queue_offset) == (0, 11)
        assert m.handle == "11 77 5000 0 0 broker-b 0 11"
