"""LMQ names may hold `$` (Apache's lite topic LMQs `%LMQ%$<parent>$<lite>`); topics and
groups keep RocketMQ 4.x's charset (core/common/names.py)."""

from __future__ import annotations

from core.broker.processors.common import required_topic
from core.common import names
from core.remoting.codec import RemotingCommand


def test_dollar_only_in_lmq_names():
    assert names.validate_lmq("%LMQ%$Parent$session-1") is None
    assert names.validate_topic_or_lmq("%LMQ%$Parent$session-1") is None
    assert names.validate_topic("Parent$x") is not None
    assert names.validate_topic_or_lmq("Parent$x") is not None
    assert names.validate_group("G$x") is not None
    # Everything else about LMQ names still holds.
    for bad in ("%LMQ%$a\n", "%LMQ%$a b", "%LMQ%$a/b", "%LMQ%", "%LMQ%$" + "x" * 130):
        assert names.validate_lmq(bad) is not None, bad


def test_broker_requests_accept_lite_lmq_names():
    cmd = RemotingCommand.request(11, {"topic": "%LMQ%$Parent$s1"})
    assert required_topic(cmd) == "%LMQ%$Parent$s1"


def test_illegal_character_reasons_use_rocketmqs_wording():
    from core.common.names import validate_group, validate_lmq, validate_topic

    allowed = "allowing only ^[%|a-zA-Z0-9_-]+$"
    assert validate_topic("a b") == f"The specified topic[a b] contains illegal characters, {allowed}"
    assert validate_group("a/b") == f"The specified group[a/b] contains illegal characters, {allowed}"
    assert validate_lmq("%LMQ%a b") == ("The LMQ name[%LMQ%a b] contains illegal characters, "
                                        "allowing only ^[%|$a-zA-Z0-9_-]+$")
