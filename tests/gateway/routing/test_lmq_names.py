"""LMQ topic names for MQTT filters / AMQP queues: valid, bounded, injective, reversible."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing.lmq_names import (
    AMQP,
    MAX_TOPIC_LENGTH,
    MQTT,
    LmqName,
    decode,
    encode,
    escape,
    hashed_topic,
    is_hashed,
    unescape,
)

ROCKETMQ_TOPIC = re.compile(r"[%|a-zA-Z0-9_-]+")
names = st.text(st.characters(blacklist_categories=("Cs",)), max_size=150)
namespaces = st.sampled_from([MQTT, AMQP, "x9"])


def valid(topic: str, max_length: int = MAX_TOPIC_LENGTH) -> bool:
    return (
        topic.startswith("%LMQ%")
        and ROCKETMQ_TOPIC.fullmatch(topic) is not None
        and len(topic.encode()) <= max_length
    )


@pytest.mark.parametrize(
    "namespace, name, topic",
    [
        (MQTT, "devices/42/temp", "%LMQ%m_devices|s42|stemp"),
        (MQTT, "a/+/#", "%LMQ%m_a|s|p|s|h"),
        (MQTT, "$SYS/#", "%LMQ%m_|mSYS|s|h"),
        (MQTT, "/", "%LMQ%m_|s"),
        (AMQP, "amq.gen-Xy_z", "%LMQ%a_amq|ogen-Xy_z"),
        (AMQP, "", "%LMQ%a_"),
        (MQTT, "é|%", "%LMQ%m_|c3|a9|7c|25"),
        (MQTT, "温度", "%LMQ%m_|e6|b8|a9|e5|ba|a6"),
    ],
)
def test_examples(namespace: str, name: str, topic: str) -> None:
    assert encode(namespace, name) == LmqName(topic, False)
    assert decode(topic) == (namespace, name)


def test_namespaces_never_collide() -> None:
    assert encode(MQTT, "q").topic != encode(AMQP, "q").topic
    assert encode(MQTT, "x" * 300).topic != encode(AMQP, "x" * 300).topic
    with pytest.raises(ValueError):
        encode("m_", "x")  # a namespace cannot contain the separators
    with pytest.raises(ValueError):
        encode("", "x")


def test_long_names_are_hashed() -> None:
    name = "fleet/" + "x" * 200
    lmq = encode(MQTT, name)
    assert lmq.hashed and valid(lmq.topic)
    assert lmq.topic == hashed_topic(MQTT, name)
    assert is_hashed(lmq.topic) and decode(lmq.topic) is None
    assert not is_hashed(encode(MQTT, "short").topic)
    # The boundary: the longest name that still fits escaped.
    fits = "y" * (MAX_TOPIC_LENGTH - len("%LMQ%m_"))
    assert encode(MQTT, fits) == LmqName("%LMQ%m_" + fits, False)
    assert encode(MQTT, fits + "y").hashed


@pytest.mark.parametrize(
    "topic",
    [
        "%LMQ%m_a|2fb",  # hex escape of a short-coded character
        "%LMQ%m_|61",  # hex escape of a literal
        "%LMQ%m_|C3|A9",  # uppercase hex
        "%LMQ%m_|c3",  # incomplete UTF-8
        "%LMQ%m_|",  # dangling escape
        "%LMQ%m_|zz",
        "%LMQ%m_a.b",  # '.' is not a valid literal
        "%LMQ%M_a",  # namespace in uppercase
        "%LMQ%_a",  # no namespace
        "%RETRY%m_a",
        "plain",
    ],
)
def test_decode_refuses_non_canonical_or_foreign(topic: str) -> None:
    assert decode(topic) is None


@given(namespaces, names)
@settings(max_examples=500)
def test_valid_bounded_and_reversible(namespace: str, name: str) -> None:
    lmq = encode(namespace, name)
    assert valid(lmq.topic)
    if lmq.hashed:
        assert is_hashed(lmq.topic) and decode(lmq.topic) is None
    else:
        assert decode(lmq.topic) == (namespace, name)
        assert unescape(escape(name)) == name


@given(namespaces, names, st.integers(60, 127))
def test_configurable_limit(namespace: str, name: str, limit: int) -> None:
    lmq = encode(namespace, name, max_length=limit)
    assert valid(lmq.topic, limit)
    assert lmq.hashed == (len(f"%LMQ%{namespace}_{escape(name)}") > limit)


@given(
    st.lists(st.tuples(namespaces, names), min_size=2, max_size=30, unique=True),
    st.integers(50, 127),
)
@settings(max_examples=300)
def test_injective(pairs: list[tuple[str, str]], limit: int) -> None:
    topics = [encode(ns, n, max_length=limit).topic for ns, n in pairs]
    assert len(set(topics)) == len(topics)


@given(st.text(alphabet="|abcdef0123456789sophmkwtABC_-.%é", max_size=20))
def test_unescape_only_accepts_what_escape_produces(text: str) -> None:
    name = unescape(text)
    if name is not None:
        assert escape(name) == text


def test_lone_surrogate_rejected() -> None:
    with pytest.raises(ValueError):
        encode(MQTT, "a\ud800")
