"""A send's properties are read once per text (core/broker/processors/send_props.py):
repeated texts are not decoded again, each send still gets a dict of its own, the memo
is bounded, and the flags it keeps say what the per-send reading said."""

from __future__ import annotations

import pytest

from core.broker.local_send import LocalSend
from core.broker.processors import send, send_props
from core.broker.processors.send import decode_send_header
from core.broker.processors.send_props import (
    PROPS_MEMO_MAX_CHARS,
    PROPS_MEMO_SIZE,
    RESERVED_PROPERTIES,
    SendPropsMemo,
)
from core.common.properties import MessageConst, decode_properties, encode_properties
from core.remoting.codes import ResponseCode
from tests.core.broker.harness import run_embedded, send_request


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
    """Every properties text the send processor decodes."""
    seen: list[str] = []

    def counting(text):
        seen.append(text)
        return decode_properties(text)

    for module in (send, send_props):
        monkeypatch.setattr(module, "decode_properties", counting)
    return seen


def test_a_repeated_text_is_decoded_once(tmp_path, decodes):
    text = encode_properties({MessageConst.INNER_MULTI_DISPATCH: "%LMQ%once", "K": "v"})

    async def body(server, client):
        local = LocalSend.of(server.broker)
        h = decode_send_header(send_request("OnceT", b"x", code=310, properties=text))
        for _ in range(20):
            sent = await local.send(h, b"x")
            assert sent.code == ResponseCode.SUCCESS
        assert server.broker.store.max_offset("%LMQ%once", 0) == 20

    run_embedded(body, tmp_path)
    assert decodes.count(text) == 1


def test_each_send_gets_its_own_properties(tmp_path):
    """A retry topic's send drops the reserved names from its copy; the same text sent
    next to a plain topic still multi-dispatches (trusted) or is refused (a client)."""
    text = encode_properties({MessageConst.INNER_MULTI_DISPATCH: "%LMQ%own"})

    async def body(server, client):
        broker = server.broker
        local = LocalSend.of(broker)
        retry = decode_send_header(send_request("%RETRY%grp", b"r", code=310, properties=text))
        plain = send_request("OwnT", b"p", code=310, properties=text)
        for _ in range(2):
            assert (await local.send(retry, b"r")).code == ResponseCode.SUCCESS
        assert broker.store.max_offset("%LMQ%own", 0) == 0  # dropped for the retry topic
        assert (await local.send(decode_send_header(plain), b"p")).code == ResponseCode.SUCCESS
        assert broker.store.max_offset("%LMQ%own", 0) == 1
        resp = await client.invoke(broker.broker_addr, plain)
        assert resp.code == ResponseCode.NO_PERMISSION
        assert MessageConst.INNER_MULTI_DISPATCH in resp.remark

    run_embedded(body, tmp_path)


def test_the_memo_is_bounded():
    memo = SendPropsMemo("C")
    for i in range(PROPS_MEMO_SIZE * 3):
        memo.read(f"K\x01{i}")
        assert len(memo.entries) <= PROPS_MEMO_SIZE
    long = "K\x01" + "v" * PROPS_MEMO_MAX_CHARS
    memo.entries.clear()
    got = memo.read(long)
    assert got.props["K"] == "v" * PROPS_MEMO_MAX_CHARS
    assert long not in memo.entries  # read, not kept


@pytest.mark.parametrize(("props", "reserved", "delayed", "timed", "prepared"), [
    ({}, (), False, False, False),
    ({"DELAY": "3"}, (), True, True, False),
    ({"DELAY": "0"}, (), False, False, False),
    ({"DELAY": "x"}, (), False, False, False),
    ({"TIMER_DELIVER_MS": "1"}, (), False, True, False),
    ({"TRAN_MSG": "TRUE"}, (), False, False, True),
    ({"TRAN_MSG": "false"}, (), False, False, False),
    ({MessageConst.INNER_MULTI_QUEUE_OFFSET: "1", "A": "b"},
     (MessageConst.INNER_MULTI_QUEUE_OFFSET,), False, False, False),
    ({MessageConst.INNER_MULTI_DISPATCH: "%LMQ%a", MessageConst.INNER_MULTI_QUEUE_OFFSET: "0"},
     RESERVED_PROPERTIES, False, False, False),
])
def test_flags(props, reserved, delayed, timed, prepared):
    text = encode_properties({**props, MessageConst.WAIT_STORE_MSG_OK: "true"})
    got = SendPropsMemo("Cl").read(text)
    assert (got.reserved, got.delayed, got.timed, got.prepared) == (
        reserved, delayed, timed, prepared)
    assert got.props == {**props, MessageConst.CLUSTER: "Cl"}  # WAIT left out
    assert decode_properties(got.text) == got.props
    assert SendPropsMemo("Cl").read(None).props == {MessageConst.CLUSTER: "Cl"}
