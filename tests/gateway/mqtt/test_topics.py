"""Topic name / filter validation, shared subscriptions and the reference matcher."""

from __future__ import annotations

import pytest

from gateway.mqtt.packets import MqttProtocolError, ReasonCode
from gateway.mqtt.topics import (
    SharedSubscription,
    is_wildcard_filter,
    parse_shared_subscription,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)


@pytest.mark.parametrize("name", ["a", "a/b", "/", "//", "a//b", "/a", "a/", "$SYS/x", " ", "é/ü"])
def test_valid_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", "a/+", "+", "#", "a/#", "a+b", "a#", "a\x00b", "a\ud800"])
def test_malformed_names(name: str) -> None:
    with pytest.raises(MqttProtocolError) as info:
        validate_topic_name(name)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


def test_name_limits_use_topic_name_invalid() -> None:
    validate_topic_name("x" * 65535)
    validate_topic_name("é" * 5, max_length=10)  # 10 bytes of UTF-8
    for name, kw in [("é" * 6, {"max_length": 10}), ("/".join("a" * 4), {"max_levels": 3})]:
        with pytest.raises(MqttProtocolError) as info:
            validate_topic_name(name, **kw)  # type: ignore[arg-type]
        assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID
    validate_topic_name("/".join("a" * 128))
    with pytest.raises(MqttProtocolError):
        validate_topic_name("/".join("a" * 129))  # default: 128 levels


@pytest.mark.parametrize(
    "topic_filter",
    [
        "#",
        "+",
        "+/+",
        "a/#",
        "a/+/b",
        "+/#",
        "/#",
        "a//+",
        "/",
        "$SYS/#",
        "a/b/",
        "sport/+/player1",
    ],
)
def test_valid_filters(topic_filter: str) -> None:
    assert validate_topic_filter(topic_filter) is None
    assert is_wildcard_filter(topic_filter) == ("+" in topic_filter or "#" in topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    # §4.7.1.2 / §4.7.1.3 non-normative examples of invalid filters, and more.
    [
        "",
        "sport/tennis#",
        "sport/tennis/#/ranking",
        "sport+",
        "a/#/",
        "#/",
        "a/b+",
        "++",
        "##",
        "a\x00",
    ],
)
def test_malformed_filters(topic_filter: str) -> None:
    with pytest.raises(MqttProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


@pytest.mark.parametrize(
    "topic_filter, expected",
    [
        ("$share/g/a/b", SharedSubscription("g", "a/b")),
        ("$share/consumer1/sport/tennis/+", SharedSubscription("consumer1", "sport/tennis/+")),
        ("$share/g/#", SharedSubscription("g", "#")),
        ("$share/g//", SharedSubscription("g", "/")),
        ("$share/é/$SYS/x", SharedSubscription("é", "$SYS/x")),
        ("$share", None),  # just a topic level called "$share"
        ("$sharex/g/a", None),
        ("a/$share/g/b", None),
    ],
)
def test_shared_subscriptions(topic_filter: str, expected: SharedSubscription | None) -> None:
    assert validate_topic_filter(topic_filter) == expected
    assert parse_shared_subscription(topic_filter) == expected


@pytest.mark.parametrize(
    "topic_filter",
    ["$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/#/a", "$share/g/a/#/b"],
)
def test_malformed_shared_subscriptions(topic_filter: str) -> None:
    with pytest.raises(MqttProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


def test_shared_can_be_disabled() -> None:
    assert validate_topic_filter("$share/g/a", allow_shared=False) is None
    validate_topic_filter("$share//a", allow_shared=False)  # an ordinary valid filter then


def test_filter_limits_use_topic_filter_invalid() -> None:
    for topic_filter, kw in [
        ("a" * 11, {"max_length": 10}),
        ("a/+/#", {"max_levels": 2}),
        ("$share/g/a/b/c", {"max_levels": 2}),  # levels of the subscribed filter
    ]:
        with pytest.raises(MqttProtocolError) as info:
            validate_topic_filter(topic_filter, **kw)  # type: ignore[arg-type]
        assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID
    validate_topic_filter("$share/g/a/b", max_levels=2)


@pytest.mark.parametrize(
    "topic_filter, topic, matches",
    [
        # MQTT 5.0 §4.7.1.2 examples
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        # §4.7.1.3
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        # §4.7.2
        ("#", "$SYS/monitor/Clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        # empty levels and case
        ("a//b", "a//b", True),
        ("a/+/b", "a//b", True),
        ("+", "", True),
        ("#", "/", True),
        ("ACCOUNTS", "Accounts", False),
        ("a/b", "a/b/", False),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches
