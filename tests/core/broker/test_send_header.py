"""decode_send_header reads the send headers the way Java's SendMessageRequestHeader(V2)
decoding does: the expected outcome of each generated header comes from a model written
from the protocol (field names, Java int/long ranges), not from the implementation; an
error is compared by the field it names, not by its wording."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.broker.processors.send import SendHeader, decode_send_header
from core.remoting.codec import RemotingCommand
from core.remoting.errors import HeaderError

# SendMessageRequestHeader (code 10) field names and their SendMessageRequestHeaderV2
# letters (codes 310, 320), in the order of the Java classes.
FIELDS = [
    ("producerGroup", "a"), ("topic", "b"), ("defaultTopic", "c"),
    ("defaultTopicQueueNums", "d"), ("queueId", "e"), ("sysFlag", "f"),
    ("bornTimestamp", "g"), ("flag", "h"), ("properties", "i"), ("reconsumeTimes", "j"),
    ("unitMode", "k"), ("maxReconsumeTimes", "l"), ("batch", "m"),
]
JAVA_INT = (-2147483648, 2147483647)
JAVA_LONG = (-9223372036854775808, 9223372036854775807)
# Integer.parseInt / Long.parseLong: an optional sign and digits, nothing else.
JAVA_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def _model(cmd: RemotingCommand):
    """Expected result: ("ok", values...) or ("error", name of the first bad field)."""
    names = [long if cmd.code == 10 else letter for long, letter in FIELDS]
    ext = cmd.ext_fields or {}

    class Bad(Exception):
        pass

    def number(i, bounds, optional=False):
        value = ext.get(names[i])
        if value is None or value == "":
            if optional:
                return None
            raise Bad(names[i])
        text = str(value)  # JSON numbers arrive as numbers from some clients
        if JAVA_INTEGER_TEXT.fullmatch(text) is None or not bounds[0] <= int(text) <= bounds[1]:
            raise Bad(names[i])
        return int(text)

    def string(i):
        value = ext.get(names[i])
        if value is None:
            raise Bad(names[i])
        return str(value)

    def flag(i):
        return str(ext.get(names[i], "")).lower() in ("true", "1")

    try:
        values = (
            string(0), string(1), string(2), number(3, JAVA_INT), number(4, JAVA_INT),
            number(5, JAVA_INT), number(6, JAVA_LONG), number(7, JAVA_INT),
            None if ext.get(names[8]) is None else str(ext[names[8]]),
            number(9, JAVA_INT, optional=True) or 0, flag(10),
            number(11, JAVA_INT, optional=True), cmd.code == 320 or flag(12),
        )
    except Bad as exc:
        return ("error", exc.args[0])
    return ("ok", *values)


def _outcome(cmd):
    try:
        h: SendHeader = decode_send_header(cmd)
    except HeaderError as exc:
        return ("error", exc.name)
    return ("ok", h.producer_group, h.topic, h.default_topic, h.default_topic_queue_nums,
            h.queue_id, h.sys_flag, h.born_timestamp, h.flag, h.properties, h.reconsume_times,
            h.unit_mode, h.max_reconsume_times, h.batch)


numbers = st.one_of(
    st.integers(-(1 << 65), 1 << 65).map(str), st.integers(-10, 10),
    st.integers(-(1 << 65), 1 << 65).map(lambda n: f"+{n}" if n >= 0 else str(n)),
    st.sampled_from(["", "x", "2147483647", "2147483648", "-2147483648", "-2147483649",
                     "9223372036854775807", "9223372036854775808", "4.5", "1e3", "0x10",
                     "--1", "+", "-", "007"]),
    st.none(),
)
words = st.one_of(st.text(max_size=40), st.integers(0, 9), st.none())
flags = st.sampled_from(["0", "1", "true", "false", "TRUE", "", None, 1])
field_values = {0: words, 1: words, 2: words, 8: words, 10: flags, 12: flags}


@st.composite
def send_commands(draw):
    code = draw(st.sampled_from([10, 310, 320]))
    ext = {}
    for i, (long, letter) in enumerate(FIELDS):
        value = draw(field_values.get(i, numbers))
        if value is not None:
            ext[long if code == 10 else letter] = value
    return RemotingCommand(code, ext_fields=ext)


@settings(max_examples=600, deadline=None)
@given(send_commands())
def test_headers_decode_as_java_does(cmd):
    assert _outcome(cmd) == _model(cmd)


@pytest.mark.parametrize("value", [" 7 ", "1_0", True, "7\n", "+-7", 7.0])
def test_non_java_integers_are_refused(value):
    ext = {long: "1" for long, _ in FIELDS}
    ext["queueId"] = value
    with pytest.raises(HeaderError):
        decode_send_header(RemotingCommand(10, ext_fields=ext))


def test_usual_headers():
    java = RemotingCommand(310, ext_fields={
        "a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1700000000000",
        "h": "0", "i": "TAGS\x01A", "j": "0", "k": "false", "l": "16", "m": "false"})
    h = decode_send_header(java)
    assert (h.topic, h.queue_id, h.born_timestamp, h.max_reconsume_times, h.batch) == \
        ("T", 3, 1700000000000, 16, False)
    cpp = RemotingCommand(10, ext_fields={
        "producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
        "bornTimestamp": "1700000000000", "flag": "0", "reconsumeTimes": "0",
        "unitMode": "0", "batch": "1"})
    h = decode_send_header(cpp)
    assert (h.batch, h.unit_mode, h.properties, h.max_reconsume_times) == (True, False, None, None)


def test_non_java_integers_are_refused_over_tcp(tmp_path):
    """A running broker answers such headers with SYSTEM_ERROR naming the field, for a
    send (its own fast decoder) as for the other requests (the shared ext_int32/64)."""
    from core.remoting.codes import ResponseCode
    from tests.core.broker.harness import pull_request, run_embedded, send_request

    async def body(server, client):
        addr = server.broker.broker_addr
        assert (await client.invoke(addr, send_request("StrictT"))).code == 0
        for value in (" 0 ", "0_0", True):
            resp = await client.invoke(addr, send_request("StrictT", extra={"queueId": value}))
            assert resp.code == ResponseCode.SYSTEM_ERROR and "queueId" in resp.remark, value
            pull = pull_request("CID_STRICT", "StrictT")
            pull.ext_fields["maxMsgNums"] = value
            resp = await client.invoke(addr, pull)
            assert resp.code == ResponseCode.SYSTEM_ERROR and "maxMsgNums" in resp.remark, value
        resp = await client.invoke(addr, pull_request("CID_STRICT", "StrictT"))
        assert resp.code == 0 and resp.ext_fields["maxOffset"] == "1"  # only the good send

    run_embedded(body, tmp_path)
