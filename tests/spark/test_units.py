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
