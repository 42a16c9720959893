"""LocalSend (core/broker/local_send.py): a store without a request gives what the send
request gives — the same stored message, and for each refusal the same response code and
remark (a request over TCP beside it, against the same real broker)."""

from __future__ import annotations

import pytest

from core.acl import Credentials, PlainAclGuard, parse_acl, sign_request
from core.broker.local_send import LocalSend
from core.broker.processors.send import decode_send_header
from core.broker.topic_config import TopicConfig
from core.client.errors import MQBrokerError
from core.common.msgid import decode_offset_msg_id
from core.common.properties import MessageConst
from core.common.sysflag import PermName
from core.remoting.codes import ResponseCode
from tests.core.broker.harness import batch_body, run_embedded, send_request
from tests.core.broker.test_send import pull_all


async def _both(server, client, cmd, local: LocalSend, signed_as=None):
    """(request's code, remark), (LocalSend's code, remark) for one send."""
    if signed_as is not None:
        sign_request(cmd, Credentials(*signed_as))
    resp = await client.invoke(server.broker.broker_addr, cmd)
    try:
        sent = await local.send(decode_send_header(cmd), cmd.body_bytes())
    except MQBrokerError as exc:
        got = (exc.code, exc.remark)
    else:
        got = (sent.code, None)
    return (resp.code, resp.remark if resp.code else None), got


def test_stores_what_the_request_stores(tmp_path):
    async def body(server, client):
        local = LocalSend.of(server.broker)
        addr = server.broker.broker_addr
        props = {"TAGS": "t", MessageConst.INNER_MULTI_DISPATCH: "%LMQ%a,%LMQ%b"}
        for cmd in (send_request("LocalT", b"one", code=310, properties=props),
                    send_request("LocalT", batch_body([(b"b0", {}), (b"b1", {"K": "v"})]),
                                 code=320)):
            h = decode_send_header(cmd)
            sent = await local.send(h, cmd.body_bytes())
            assert sent.code == ResponseCode.SUCCESS
            offsets = [decode_offset_msg_id(m)[2] for m in sent.result.msg_ids]
            assert len(offsets) == (2 if h.batch else 1)
        msgs = await pull_all(client, addr, "LocalT")
        assert [m.body for m in msgs] == [b"one", b"b0", b"b1"]
        assert msgs[0].properties["TAGS"] == "t"
        assert msgs[2].properties["K"] == "v"
        # The LMQs of INNER_MULTI_DISPATCH were written (in-process: a trusted peer).
        assert server.broker.store.max_offset("%LMQ%a", 0) == 1
        assert local.sends == 2

    run_embedded(body, tmp_path)


def test_refusals_keep_the_request_codes(tmp_path):
    async def body(server, client):
        broker = server.broker
        local = LocalSend.of(broker)
        tcm = broker.topic_config_manager
        for name in ("BigT", "BatchT"):
            tcm.update(TopicConfig(name, 1, 1))
        tcm.update(TopicConfig("ReadOnly", 1, 1, PermName.READ))
        big = b"x" * (broker.config.max_message_size + 1)
        cases = {
            "too large": send_request("BigT", big, code=310),
            "too large batch": send_request("BigT", batch_body([(big, {})]), code=320),
            "read-only topic": send_request("ReadOnly", b"x", code=310),
            "LMQ topic": send_request("%LMQ%direct", b"x", code=310),
            "bad name": send_request("bad name!", b"x", code=310),
            "bad batch body": send_request("BatchT", b"\x00\x00\x00\x05junk", code=320),
            "no default topic": send_request("NoAuto", b"x", code=310,
                                             default_topic="NoSuchDefault"),
        }
        for name, cmd in cases.items():
            wire, got = await _both(server, client, cmd, local)
            assert wire[0] != ResponseCode.SUCCESS, name
            assert got == wire, name

    run_embedded(body, tmp_path, auto_create_topic_enable=False)


ACCOUNTS = {"accounts": [
    {"accessKey": "gwuser", "secretKey": "gw-secret", "innerProperties": True,
     "defaultTopicPerm": "DENY", "topicPerms": ["MqttT=PUB"]},
    {"accessKey": "appuser", "secretKey": "app-secret", "defaultTopicPerm": "PUB"},
]}


@pytest.mark.parametrize("who", ["gwuser", "appuser"])
def test_acl_of_the_gateway_account(tmp_path, who):
    """With in-process peers not trusted, LocalSend checks its account as the request's
    guard checks the signed request: topic rights, INNER_MULTI_DISPATCH rights."""
    secret = {"gwuser": "gw-secret", "appuser": "app-secret"}[who]

    async def body(server, client):
        guard = PlainAclGuard(parse_acl(ACCOUNTS), trust_in_process=False)
        server.broker.table.guard = guard
        local = LocalSend.of(server.broker, who)
        inner = {MessageConst.INNER_MULTI_DISPATCH: "%LMQ%x"}
        cases = [send_request("MqttT", b"x", code=310), send_request("OtherT", b"x", code=310),
                 send_request("MqttT", b"x", code=310, properties=inner)]
        answers = []
        for cmd in cases:
            wire, got = await _both(server, client, cmd, local, signed_as=(who, secret))
            assert got[0] == wire[0], (who, cmd.ext_fields)
            if wire[0]:
                assert got[1] == wire[1]
            answers.append(wire[0])
        if who == "gwuser":  # its topic only; may multi-dispatch
            assert answers == [0, ResponseCode.SYSTEM_ERROR, 0]
        else:  # any topic; may not multi-dispatch
            assert answers == [0, 0, ResponseCode.NO_PERMISSION]
        # A broker trusting in-process peers (the default) trusts LocalSend too.
        guard.trust_in_process = True
        sent = await local.send(decode_send_header(cases[1]), b"x")
        assert sent.code == ResponseCode.SUCCESS

    run_embedded(body, tmp_path)


def test_none_in_apache_strict_mode(tmp_path):
    async def body(server, client):
        assert LocalSend.of(server.broker) is None

    run_embedded(body, tmp_path, apache_strict=True)
