"""Store-facing filters against hand-built CommitLog records (docs/protocol.md §7.1)."""

from __future__ import annotations

import struct
import zlib

import pytest

from core.broker.filter import (
    ExpressionType,
    FilterLimits,
    FilterParseError,
    MessageFilter,
    SqlMessageFilter,
    TagMessageFilter,
    build_message_filter,
    compile_sql92,
    java_string_hash,
    parse_tag_expression,
)

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB

# docs/protocol.md §7.1 test vector: topic T, body "hi", TAGS=A, UNIQ_KEY=ABCD (115 bytes).
DOC_VECTOR = bytes.fromhex(
    "00000073" "daa320a7" "58932aac" "00000001" "00000000" "0000000000000005"
    "00000000000003e8" "00000000" "0000018bcfe56800" "0a0000020000c350"
    "0000018bcfe5687b" "0a00000100002a9f" "00000000" "0000000000000000"
    "00000002" "6869" "01" "54" "0015"
    "54414753014102554e49515f4b4559014142434402"
)


def props_bytes(props: dict[str, str], *, trailing: bool = False) -> bytes:
    text = "\x02".join(f"{k}\x01{v}" for k, v in props.items())
    if trailing and text:
        text += "\x02"
    return text.encode("utf-8")


def make_record(
    props: dict[str, str] | bytes,
    *,
    topic: str = "TopicTest",
    body: bytes = b"body",
    v2: bool = False,
    born_v6: bool = False,
    store_v6: bool = False,
    trailing: bool = False,
) -> bytes:
    """One stored record, packed field by field from the docs/protocol.md §7.1 table."""
    raw_props = props if isinstance(props, bytes) else props_bytes(props, trailing=trailing)
    topic_raw = topic.encode()
    sys_flag = (0x10 if born_v6 else 0) | (0x20 if store_v6 else 0)
    ipv6 = b"\x00" * 15 + b"\x01"  # ::1
    born_host = (ipv6 if born_v6 else b"\x0a\x00\x00\x02") + struct.pack(">i", 50000)
    store_host = (ipv6 if store_v6 else b"\x0a\x00\x00\x01") + struct.pack(">i", 10911)
    parts = [
        struct.pack(">I", MAGIC_V2 if v2 else MAGIC_V1),
        struct.pack(">I", zlib.crc32(body) & 0x7FFFFFFF),
        struct.pack(">iiqqi", 0, 0, 7, 4096, sys_flag),
        struct.pack(">q", 1_700_000_000_000), born_host,
        struct.pack(">q", 1_700_000_000_123), store_host,
        struct.pack(">iq", 0, 0),
        struct.pack(">i", len(body)), body,
        struct.pack(">h" if v2 else ">B", len(topic_raw)), topic_raw,
        struct.pack(">h", len(raw_props)), raw_props,
    ]
    payload = b"".join(parts)
    return struct.pack(">i", len(payload) + 4) + payload


# --- build_message_filter --------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression_type", "expression"),
    [(None, None), (None, "*"), ("", ""), ("TAG", "*"), ("TAG", None), ("TAG", "")],
)
def test_match_all_subscriptions_need_no_filter(expression_type, expression) -> None:
    assert build_message_filter(expression_type, expression) is None


def test_builds_tag_and_sql_filters() -> None:
    tag = build_message_filter(None, "TagA || TagB")  # C++ clients omit the type
    assert isinstance(tag, TagMessageFilter) and not tag.exact
    assert tag.subscription.tags == {"TagA", "TagB"}
    exact = build_message_filter(ExpressionType.TAG, "TagA", exact_tags=True)
    assert isinstance(exact, TagMessageFilter) and exact.exact
    sql = build_message_filter(ExpressionType.SQL92, "a > 1")
    assert isinstance(sql, SqlMessageFilter)
    assert sql.sql is compile_sql92("a > 1")
    for f in (tag, exact, sql):
        assert isinstance(f, MessageFilter)


@pytest.mark.parametrize(
    ("expression_type", "expression"),
    [
        ("SQL92", None),
        ("SQL92", ""),
        ("SQL92", "a >"),
        ("SQL92", "a > 'x'"),
        ("SQL92", "*"),
        ("sql92", "a > 1"),  # Java compares the type exactly
        ("XPATH", "//a"),
        ("CLASS", "com.example.Filter"),
    ],
)
def test_bad_subscriptions_raise_parse_error(expression_type, expression) -> None:
    with pytest.raises(FilterParseError) as info:
        build_message_filter(expression_type, expression)
    assert info.value.response_code == 23


def test_limits_reach_the_sql_compiler() -> None:
    limits = FilterLimits(max_expression_length=8)
    with pytest.raises(FilterParseError):
        build_message_filter("SQL92", "a = 'long'", limits=limits)
    assert build_message_filter("SQL92", "a = 'x'", limits=limits) is not None


# --- TAG filters -----------------------------------------------------------------------


def test_tag_filter_consume_queue_check_uses_hash_codes() -> None:
    f = TagMessageFilter("TagA || TagB")
    assert f.is_matched_by_consume_queue(java_string_hash("TagA"))
    assert f.is_matched_by_consume_queue(2598920)
    assert not f.is_matched_by_consume_queue(java_string_hash("TagC"))
    assert not f.is_matched_by_consume_queue(0)  # untagged message
    assert f.is_matched_by_consume_queue((1 << 40) | 2598919)  # Java intValue()


def test_tag_filter_commit_log_check_defers_to_client_unless_exact() -> None:
    record = make_record({"TAGS": "TagC"})
    assert TagMessageFilter("TagA").is_matched_by_commit_log(record)
    exact = TagMessageFilter("TagA", exact=True)
    assert not exact.is_matched_by_commit_log(record)
    assert exact.is_matched_by_commit_log(make_record({"KEYS": "k", "TAGS": "TagA"}))
    assert not exact.is_matched_by_commit_log(make_record({"KEYS": "k"}))


def test_exact_tag_filter_removes_hash_collisions() -> None:
    # "Aa" and "BB" share Java hash 2112: the consume queue cannot tell them apart.
    assert java_string_hash("Aa") == java_string_hash("BB")
    loose = TagMessageFilter("Aa")
    exact = TagMessageFilter("Aa", exact=True)
    bb = make_record({"TAGS": "BB"})
    aa = make_record({"TAGS": "Aa"})
    for f in (loose, exact):
        assert f.is_matched_by_consume_queue(java_string_hash("BB"))
    assert loose.is_matched_by_commit_log(bb)
    assert not exact.is_matched_by_commit_log(bb)
    assert exact.is_matched_by_commit_log(aa)
    assert loose.matches_properties({"TAGS": "BB"})
    assert not exact.matches_properties({"TAGS": "BB"})


def test_tag_filter_matches_properties() -> None:
    f = TagMessageFilter(parse_tag_expression("TagA"))
    assert f.matches_properties({"TAGS": "TagA"})
    assert not f.matches_properties({"TAGS": "TagB"})
    assert not f.matches_properties({})
    all_ = TagMessageFilter("*")
    assert all_.matches_properties({})
    assert all_.is_matched_by_consume_queue(123)
    assert all_.is_matched_by_commit_log(b"garbage")


def test_exact_tag_filter_rejects_damaged_record_without_raising() -> None:
    exact = TagMessageFilter("TagA", exact=True)
    good = make_record({"TAGS": "TagA"})
    assert exact.is_matched_by_commit_log(good)
    for bad in (good[:50], good[:-3], b"", b"\x00" * 200):
        assert not exact.is_matched_by_commit_log(bad)


# --- SQL92 filters ---------------------------------------------------------------------


def test_sql_filter_on_doc_test_vector() -> None:
    assert len(DOC_VECTOR) == 115
    f = SqlMessageFilter("TAGS = 'A' AND UNIQ_KEY = 'ABCD'")
    assert f.is_matched_by_commit_log(DOC_VECTOR)
    assert f.is_matched_by_commit_log(memoryview(DOC_VECTOR))
    assert not SqlMessageFilter("TAGS = 'B'").is_matched_by_commit_log(DOC_VECTOR)
    assert TagMessageFilter("A", exact=True).is_matched_by_commit_log(DOC_VECTOR)
    assert not TagMessageFilter("B", exact=True).is_matched_by_commit_log(DOC_VECTOR)


def test_sql_filter_passes_every_consume_queue_unit() -> None:
    f = SqlMessageFilter("a = 'x'")
    assert all(f.is_matched_by_consume_queue(code) for code in (0, 42, -1, 2**40))


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"trailing": True},  # C++ clients keep the final separator
        {"v2": True},
        {"born_v6": True},
        {"store_v6": True},
        {"born_v6": True, "store_v6": True, "v2": True},
        {"body": b""},
        {"body": b"\x01\x02" * 5000},
        {"topic": "%LMQ%" + "t" * 100},
    ],
)
def test_sql_filter_reads_properties_in_every_layout(layout) -> None:
    props = {"TAGS": "TagA", "region": "eu", "price": "12.5", "UNIQ_KEY": "X"}
    record = make_record(props, **layout)
    f = SqlMessageFilter("TAGS = 'TagA' AND region = 'eu' AND price > 10.0")
    assert f.is_matched_by_commit_log(record)
    assert not SqlMessageFilter("region = 'us'").is_matched_by_commit_log(record)


def test_sql_filter_on_a_slice_of_a_larger_buffer() -> None:
    records = [make_record({"n": str(i), "TAGS": f"T{i % 3}"}) for i in range(20)]
    log = bytearray(b"".join(records))
    view = memoryview(log)
    f = SqlMessageFilter("n >= 5 AND n < 9 AND TAGS <> 'T0'")
    matched = []
    pos = 0
    for i, rec in enumerate(records):
        if f.is_matched_by_commit_log(view[pos : pos + len(rec)]):
            matched.append(i)
        pos += len(rec)
    assert matched == [5, 7, 8]


def test_missing_and_empty_properties() -> None:
    # Java's parser skips pairs with an empty name or value: they are NULL.
    record = make_record(b"a\x01\x02\x01x\x02b\x01y")
    assert SqlMessageFilter("a IS NULL AND b = 'y'").is_matched_by_commit_log(record)
    assert SqlMessageFilter("a IS NULL").is_matched_by_commit_log(make_record({}))


def test_duplicate_property_last_one_wins() -> None:
    # A batch sub-message's properties are followed by the batch-level ones.
    record = make_record(b"k\x01first\x02k\x01second")
    assert SqlMessageFilter("k = 'second'").is_matched_by_commit_log(record)


def test_non_ascii_and_invalid_utf8_properties() -> None:
    record = make_record({"city": "北京", "TAGS": "中文"})
    assert SqlMessageFilter("city = '北京' AND TAGS = '中文'").is_matched_by_commit_log(record)
    assert TagMessageFilter("中文", exact=True).is_matched_by_commit_log(record)
    broken = make_record(b"a\x01\xff\xfe\x02b\x01ok")
    assert SqlMessageFilter("b = 'ok' AND a IS NOT NULL").is_matched_by_commit_log(broken)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r[:40],  # truncated header
        lambda r: r[:-2],  # truncated properties
        lambda r: b"",
        lambda r: struct.pack(">i", 10) + r[4:],  # total size too small
        lambda r: struct.pack(">i", len(r) + 50) + r[4:],  # total size past the buffer
        lambda r: r[:4] + b"\xca\xfe\xba\xbe" + r[8:],  # bad magic
        lambda r: r[:84] + struct.pack(">i", 10**6) + r[88:],  # body length past the end
        lambda r: r[:84] + struct.pack(">i", -5) + r[88:],
        lambda r: r[:36] + struct.pack(">i", 0x30) + r[40:],  # IPv6 flags on IPv4 hosts
    ],
)
def test_damaged_records_never_match_and_never_raise(mutate) -> None:
    record = make_record({"a": "1"})
    f = SqlMessageFilter("a IS NULL OR a IS NOT NULL")
    assert f.is_matched_by_commit_log(record)
    assert not f.is_matched_by_commit_log(mutate(record))


def test_pull_scan_end_to_end() -> None:
    """Run both stages as the store does over a small queue of messages."""
    messages = [
        {"TAGS": "TagA", "region": "eu", "n": "1"},
        {"TAGS": "TagB", "region": "us", "n": "2"},
        {"TAGS": "TagC", "region": "eu", "n": "3"},
        {"region": "eu", "n": "4"},
        {"TAGS": "TagA", "region": "us", "n": "5"},
    ]
    units = [(java_string_hash(m["TAGS"]) if "TAGS" in m else 0, make_record(m)) for m in messages]

    def numbers(f) -> list[int]:
        picked = []
        for i, (code, record) in enumerate(units):
            if f is None:
                picked.append(i + 1)
            elif f.is_matched_by_consume_queue(code) and f.is_matched_by_commit_log(record):
                picked.append(i + 1)
        return picked

    assert numbers(build_message_filter(None, "*")) == [1, 2, 3, 4, 5]
    assert numbers(build_message_filter("TAG", "TagA || TagC")) == [1, 3, 5]
    assert numbers(build_message_filter("SQL92", "region = 'eu'")) == [1, 3, 4]
    assert numbers(build_message_filter("SQL92", "TAGS IS NULL OR n > 4")) == [4, 5]
    assert numbers(build_message_filter("SQL92", "TAGS IN ('TagA') AND region <> 'eu'")) == [5]
    assert numbers(build_message_filter("TAG", "TagB")) == [2]
    assert numbers(build_message_filter("TAG", "TagB", exact_tags=True)) == [2]
