"""Tag hashes, properties, names and message ids."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.common import names
from core.common.codec import encode_host
from core.common.message import Message, MessageExt
from core.common.msgid import UniqKeyGenerator, decode_offset_msg_id, offset_msg_id
from core.common.properties import decode_properties, encode_properties
from core.common.taghash import java_string_hash, tag_hash


@pytest.mark.parametrize(
    "text,expected",
    [("TagA", 2598919), ("TagB", 2598920), ("*", 42), ("中文", 646394), ("aaaaaaaaaa", -799347552)],
)
def test_java_hash_vectors(text, expected):
    # docs/protocol.md §7.10
    assert java_string_hash(text) == expected


def test_tag_hash_non_bmp_counts_two_utf16_units():
    # "😀" is U+D83D U+DE00 in UTF-16: 31*0xD83D + 0xDE00
    assert java_string_hash("😀") == 31 * 0xD83D + 0xDE00
    assert tag_hash(None) == 0 and tag_hash("") == 0


def test_properties_accepts_java_and_cpp_forms():
    assert decode_properties("A\x011\x02B\x012") == {"A": "1", "B": "2"}  # Java
    assert decode_properties("A\x011\x02B\x012\x02") == {"A": "1", "B": "2"}  # C++
    assert decode_properties("A\x01\x02\x01x\x02C\x013") == {"C": "3"}  # empty skipped
    assert decode_properties("") == {}


@given(
    st.dictionaries(
        st.text(alphabet=st.characters(blacklist_characters="\x01\x02"), min_size=1),
        st.text(alphabet=st.characters(blacklist_characters="\x01\x02"), min_size=1),
    )
)
def test_properties_round_trip(props):
    assert decode_properties(encode_properties(props)) == props


@pytest.mark.parametrize(
    "topic,ok",
    [
        ("TopicA", True),
        ("%RETRY%g", True),
        ("a|b-c_d", True),
        ("", False),
        ("   ", False),
        ("a/b", False),
        ("a b", False),
        ("x" * 127, True),
        ("x" * 128, False),
        # The whole name must match: `$` with re.match also matched before a final "\n".
        ("evil\n", False),
        ("evil\r", False),
        ("\nevil", False),
        ("ev\nil", False),
        ("evil\x00", False),
        ("évil", False),
    ],
)
def test_validate_topic(topic, ok):
    assert (names.validate_topic(topic) is None) is ok


@pytest.mark.parametrize("group", ["G\n", "G\r\n", "\nG", "G\x00", "G/1"])
def test_validate_group_refuses(group):
    assert names.validate_group(group) is not None
    assert names.validate_group("G") is None


def test_validate_lmq_refuses_trailing_newline():
    assert names.validate_lmq("%LMQ%dev1\n") is not None


def test_lmq_names():
    assert names.validate_lmq("%LMQ%dev1") is None
    assert names.validate_lmq("%LMQ%") is not None
    assert names.validate_lmq("dev1") is not None
    assert names.validate_lmq("%LMQ%a/b") is not None
    assert names.retry_topic("g") == "%RETRY%g" and names.dlq_topic("g") == "%DLQ%g"
    assert names.is_system_topic("SCHEDULE_TOPIC_XXXX") and names.is_system_topic("rmq_sys_x")


def test_offset_msg_id_round_trip():
    mid = offset_msg_id(encode_host("10.0.0.1:10911"), 1000)
    assert mid == "0A00000100002A9F00000000000003E8"
    assert decode_offset_msg_id(mid) == ("10.0.0.1", 10911, 1000)
    with pytest.raises(ValueError):
        decode_offset_msg_id("ABC")


def test_uniq_keys_are_unique_32_hex():
    gen = UniqKeyGenerator("10.0.0.1")
    ids = {gen.next() for _ in range(10000)}
    assert len(ids) == 10000
    one = next(iter(ids))
    assert len(one) == 32 and one.startswith("0A000001") and one == one.upper()


def test_message_accessors():
    m = Message("T", b"x")
    m.tags = "A"
    m.keys = ["k1", "k2"]
    m.delay_level = 3
    assert m.properties == {"TAGS": "A", "KEYS": "k1 k2", "DELAY": "3"}
    assert m.keys == ["k1", "k2"] and m.delay_level == 3
    m.delay_level = 0
    assert "DELAY" not in m.properties
    ext = MessageExt(
        "T",
        b"",
        properties={"INNER_MULTI_DISPATCH": "%LMQ%a,%LMQ%b", "INNER_MULTI_QUEUE_OFFSET": "4,9"},
    )
    assert ext.lmq_offsets() == {"%LMQ%a": 4, "%LMQ%b": 9}
