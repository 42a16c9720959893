"""The delivery hot path's shortcuts give exactly what the general code gives: a filter's
compiled matcher (topics.filter_matcher) and the 3.x PUBLISH built from its fields
(_encoding.publish_v3)."""

from __future__ import annotations

import pytest

from gateway.mqtt._encoding import encode_packet, publish_v3
from gateway.mqtt.packets import Publish
from gateway.mqtt.topics import filter_matcher, topic_matches

FILTERS = ["a/+", "a/b/+", "+", "#", "a/#", "+/b", "a/+/c", "+/+", "a", "a/b", "$SYS/+",
           "+/#", "a/+/#", "/+", "+/", "a//+"]
TOPICS = ["a", "a/b", "a/b/c", "a/", "/", "b", "$SYS/x", "$SYS", "a/b/", "x/b", "a//c",
          "a/x/c", "a/b/c/d", "/a", "//", "a//", "a//x"]


@pytest.mark.parametrize("topic_filter", FILTERS)
def test_filter_matcher_agrees_with_topic_matches(topic_filter):
    match = filter_matcher(topic_filter)
    for topic in TOPICS:
        assert match(topic) == topic_matches(topic_filter, topic), topic


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("qos, pid, dup", [(0, None, False), (1, 7, False), (1, 65535, True),
                                           (2, 300, False)])
@pytest.mark.parametrize("size", [0, 10, 120, 200, 16_370, 16_380, 20_000, 3_000_000])
@pytest.mark.parametrize("retain", [False, True])
def test_publish_v3_is_the_codec_encoding(version, qos, pid, dup, size, retain):
    topic = "t/\u00e9/x"
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    expected = encode_packet(Publish(topic, payload, qos, retain, dup, pid), version)
    assert publish_v3(topic, payload, qos, retain, dup, pid) == expected


def test_publish_v3_refuses_what_cannot_be_valid():
    with pytest.raises(ValueError):
        publish_v3("", b"", 0, False, False, None)
    with pytest.raises(ValueError):
        publish_v3("t", b"", 1, False, False, None)
