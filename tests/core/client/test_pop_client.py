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
