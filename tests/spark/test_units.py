"""Fast checks of the connector's pure parts (no Spark session)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from spark_sinks.options import (  # noqa: E402
    EARLIEST,
    LATEST,
    LmqOptionError,
    parse_offsets,
    parse_source_options,
)
from spark_sinks.source import make_partitions, split_limit  # noqa: E402


def test_split_limit_is_proportional_to_backlog_and_exact():
    start = {("T", "b", 0): 0, ("T", "b", 1): 100, ("T", "b", 2): 5}
    latest = {("T", "b", 0): 60, ("T", "b", 1): 120, ("T", "b", 2): 5}
    end = split_limit(start, latest, 20)
    taken = {k: end[k] - start[k] for k in start}
    assert sum(taken.values()) == 20
    assert taken == {("T", "b", 0): 15, ("T", "b", 1): 5, ("T", "b", 2): 0}
    assert split_limit(start, latest, 1000) == latest


def test_new_queue_starts_at_earliest():
    parts = make_partitions({("T", "b", 0): 3}, {("T", "b", 0): 3, ("T", "b", 1): 7})
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(1, EARLIEST, 7)]


def test_offsets_option_forms():
    assert parse_offsets("startingOffsets", "earliest", LATEST) == EARLIEST
    assert parse_offsets("startingOffsets", None, LATEST) == LATEST
    assert parse_offsets("x", '{"T": {"broker-a/0": 4, "1": -2}}', LATEST) == {
        "T": {"broker-a/0": 4, "1": -2}}
    for bad in ('{"T": {"q": 1}}', '{"T": 3}', "[1]", '{"T": {"0": -5}}'):
        with pytest.raises(LmqOptionError, match="'x'"):
            parse_offsets("x", bad, LATEST)
    with pytest.raises(LmqOptionError, match="endingOffsets"):
        parse_source_options({"lmq.namesrv": "h:1", "subscribe": "T", "endingOffsets": "earliest"},
                             streaming=False)


def test_unknown_and_streaming_only_options():
    with pytest.raises(LmqOptionError, match="option 'subscrib'"):
        parse_source_options({"lmq.namesrv": "h:1", "subscrib": "T"}, streaming=True)
    with pytest.raises(LmqOptionError, match="endingOffsets"):
        parse_source_options({"lmq.namesrv": "h:1", "subscribe": "T", "endingOffsets": "latest"},
                             streaming=True)
    opts = parse_source_options({"LMQ.NAMESRV": "h:1", "Subscribe": "A, B"}, streaming=True)
    assert opts.topics == ["A", "B"] and opts.starting == LATEST


def test_second_slice_options_are_checked():
    base = {"lmq.namesrv": "h:1"}
    for opts, named in [
        ({"subscribe": "T", "subscribePattern": "T.*"}, "subscribePattern"),
        ({"subscribePattern": "T(" }, "subscribePattern"),
        ({"subscribePattern": "a" * 10_000}, "subscribePattern"),
        ({"subscribe": "T", "startingOffsets": "earliest", "startingTimestamp": "5"},
         "startingTimestamp"),
        ({"subscribe": "T", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"subscribe": "T", "includeHeaders": "maybe"}, "includeHeaders"),
        ({"subscribe": "T", "commitGroup": "bad group!"}, "commitGroup"),
    ]:
        with pytest.raises(LmqOptionError, match=f"'{named}'"):
            parse_source_options({**base, **opts}, streaming=True)
    with pytest.raises(LmqOptionError, match="'commitGroup'"):
        parse_source_options({**base, "subscribe": "T", "commitGroup": "CG"}, streaming=False)
    opts = parse_source_options({**base, "subscribePattern": "Orders-.*", "startingTimestamp": "7",
                                 "includeHeaders": "TRUE", "commitGroup": "CG"}, streaming=True)
    assert opts.pattern.fullmatch("Orders-eu") and not opts.pattern.fullmatch("xOrders-eu")
    assert (opts.starting_ts, opts.include_headers, opts.commit_group) == (7, True, "CG")


def test_user_headers_leave_out_system_and_gateway_properties():
    from spark_sinks.rows import user_headers

    props = {"KEYS": "k", "TAGS": "t", "UNIQ_KEY": "u", "MQTT_TOPIC": "a/b", "SPARK_BATCH": "3",
             "zone": "eu", "seq": "1"}
    assert user_headers(props) == [("seq", b"1"), ("zone", b"eu")]


def test_pattern_never_offers_system_retry_dlq_or_lmq_topics():
    from spark_sinks.source import _plain_topic

    names = ["Orders", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_x", "%RETRY%G", "%DLQ%G",
             "%LMQ%x", "SCHEDULE_TOPIC_XXXX", "MQTT_MESSAGES"]
    assert [n for n in names if _plain_topic(n)] == ["Orders", "MQTT_MESSAGES"]


def test_a_small_batch_is_one_partition_a_large_one_a_partition_per_queue():
    from spark_sinks.options import DEFAULT_SMALL_BATCH_ROWS
    from spark_sinks.source import QueueRange, RangeGroup

    start = {("T", "b", q): 10 for q in range(4)}
    small = {k: v + 5 for k, v in start.items()}
    small[("T", "b", 3)] = 10                         # nothing new on queue 3
    parts = make_partitions(start, small, 15)
    assert parts == [RangeGroup(tuple(QueueRange("T", "b", q, 10, 15) for q in range(3)))]
    assert make_partitions(start, small, 15) == parts  # a re-run plans the same split
    assert len(make_partitions(start, small, 14)) == 3  # one message over: per queue
    assert len(make_partitions(start, small, 0)) == 3
    # a queue seen for the first time (start unknown) keeps the batch split per queue
    assert len(make_partitions({}, small, 10**9)) == 4
    opts = parse_source_options({"lmq.namesrv": "h:1", "subscribe": "T"}, streaming=True)
    assert opts.small_batch_rows == DEFAULT_SMALL_BATCH_ROWS > 0
    assert parse_source_options({"lmq.namesrv": "h:1", "subscribe": "T",
                                 "lmq.smallBatchRows": "0"}, streaming=True).small_batch_rows == 0
    with pytest.raises(LmqOptionError, match="'lmq.smallBatchRows'"):
        parse_source_options({"lmq.namesrv": "h:1", "subscribe": "T",
                              "lmq.smallBatchRows": "-1"}, streaming=True)


def test_mqtt_columns_read_the_gateways_stored_form():
    from core.common.message import MessageExt
    from gateway.mqtt.message import MqttMessage, to_properties
    from spark_sinks.rows import mqtt_topic_of, to_record_batch

    odd = "plant/\x01line"  # not text-safe: the gateway stores it in base64
    stored = [MqttMessage(odd, b"a", qos=2, retain=True), MqttMessage("plant/2", b"b", qos=1)]
    msgs = [MessageExt("MQTT_MESSAGES", m.payload, properties=to_properties(m)) for m in stored]
    msgs.append(MessageExt("Orders", b"c", properties={"KEYS": "k"}))
    rows = to_record_batch(msgs, "b0").to_pylist()
    assert [(r["mqttTopic"], r["qos"], r["retain"]) for r in rows] == [
        (odd, 2, True), ("plant/2", 1, False), (None, None, None)]
    assert mqtt_topic_of({"MQTT_TOPIC64": "not base64!"}) is None
