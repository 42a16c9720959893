"""decode_send_header's fast path reads every header as the field-by-field path does
(same values, same HeaderError for the same bad field)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.broker.processors.send import SendHeader, decode_send_header
from core.remoting.codec import RemotingCommand
from core.remoting.errors import HeaderError

LONG = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId",
        "sysFlag", "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode",
        "maxReconsumeTimes", "batch")
LETTERS = tuple("abcdefghijklm")
I32 = (-(1 << 31), (1 << 31) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)


def _reference(cmd: RemotingCommand) -> SendHeader:
    """The field-by-field decoding (what decode_send_header did before its fast path)."""
    n = LONG if cmd.code == 10 else LETTERS
    ext = cmd.ext_fields or {}

    def num(name, bounds, default=None):
        value = ext.get(name)
        if value is None or value == "":
            if default is None:
                raise HeaderError(name, "missing required ext field")
            return default
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise HeaderError(name, f"invalid integer {value!r} in ext field") from None
        if not bounds[0] <= number <= bounds[1]:
            raise HeaderError(name, f"value {number} out of range")
        return number

    def text(name):
        value = ext.get(name)
        if value is None:
            raise HeaderError(name, "missing required ext field")
        return value if type(value) is str else str(value)

    batch = cmd.code == 320 or bool(cmd.ext_bool(n[12], False))
    props = ext.get(n[8])
    max_re = ext.get(n[11])
    return SendHeader(
        text(n[0]), text(n[1]), text(n[2]), num(n[3], I32), num(n[4], I32), num(n[5], I32),
        num(n[6], I64), num(n[7], I32), None if props is None else str(props),
        num(n[9], I32, 0), bool(cmd.ext_bool(n[10], False)),
        None if max_re in (None, "") else num(n[11], I32), batch,
    )


def _outcome(fn, cmd):
    try:
        return fn(cmd)
    except HeaderError as exc:
        return ("error", str(exc))


numbers = st.one_of(
    st.integers(-(1 << 65), 1 << 65).map(str), st.integers(-10, 10), st.sampled_from(
        ["", " 7 ", "1_0", "x", "2147483648", "-2147483649", "9223372036854775808", "4.5"]),
    st.booleans(), st.none(),
)
words = st.one_of(st.text(max_size=5), st.integers(0, 9), st.none())
flags = st.sampled_from(["0", "1", "true", "false", "TRUE", " 1 ", "", "yes", None, 1, True])
field_values = {0: words, 1: words, 2: words, 8: words, 10: flags, 12: flags}


@st.composite
def send_commands(draw):
    code = draw(st.sampled_from([10, 310, 320]))
    names = LONG if code == 10 else LETTERS
    ext = {}
    for i, name in enumerate(names):
        value = draw(field_values.get(i, numbers))
        if value is not None:
            ext[name] = value
    return RemotingCommand(code, ext_fields=ext)


@settings(max_examples=400, deadline=None)
@given(send_commands())
def test_fast_path_agrees_with_field_by_field(cmd):
    assert _outcome(decode_send_header, cmd) == _outcome(_reference, cmd)


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
