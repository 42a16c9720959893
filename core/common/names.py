"""System names and validators: topics, groups, `%RETRY%`, `%DLQ%`, `%LMQ%` (docs/protocol.md §9.5, §10)."""

from __future__ import annotations

import re

# Topic charset and length limit of RocketMQ 4.x (docs/protocol.md §5.1 step 1). Keeping every topic
# (retry and DLQ topics included) within 127 UTF-8 bytes means every record is magic v1
# with a 1-byte topic length, the only form the C++ client decodes (docs/protocol.md §7.1).
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 120  # "%RETRY%" + group must still fit in 127 bytes.
# Always used with fullmatch: with re.match, `$` also matches before a trailing newline,
# which let "evil\n" through and created a directory with a newline in its name.
_VALID_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")
# LMQ names may also hold `$`: Apache's lite topics are the LMQs `%LMQ%$<parent>$<lite>`
# (RIP-83, docs/grpc.md "Lite topics"). Topics and groups keep the 4.x charset; the
# gateways' own LMQ names (gateway/routing/lmq_names.py) never contain `$`.
_LMQ_CHARS = re.compile(r"[%|$a-zA-Z0-9_-]+")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
LMQ_PREFIX = "%LMQ%"
LMQ_QUEUE_ID = 0

AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
BENCHMARK_TOPIC = "BenchmarkTest"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

SYSTEM_TOPICS = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        BENCHMARK_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        TRACE_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)
# Producers may not write to these directly (docs/protocol.md §5.1 step 1): NO_PERMISSION.
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
DEFAULT_CONSUMER_GROUP = "DEFAULT_CONSUMER"
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"


def validate_topic(topic: str | None) -> str | None:
    """Return None when `topic` is a legal topic name, else the reason it is not."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if len(topic.encode("utf-8")) > TOPIC_MAX_LENGTH:
        return f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}."
    if not _VALID_CHARS.fullmatch(topic):
        return _illegal_chars("specified topic", topic, _VALID_CHARS)
    return None


def validate_group(group: str | None) -> str | None:
    """Return None when `group` is a legal consumer/producer group name."""
    if not group or not group.strip():
        return "The specified group is blank."
    if len(group) > GROUP_MAX_LENGTH:
        return f"The specified group is longer than group max length {GROUP_MAX_LENGTH}."
    if not _VALID_CHARS.fullmatch(group):
        return _illegal_chars("specified group", group, _VALID_CHARS)
    return None


def is_lmq(name: str) -> bool:
    return name.startswith(LMQ_PREFIX)


def validate_lmq(name: str) -> str | None:
    """An LMQ name starts with `%LMQ%`, has a non-empty rest and is a valid topic name,
    except that `$` is allowed too (lite topics)."""
    if not is_lmq(name) or len(name) == len(LMQ_PREFIX):
        return f"The LMQ name[{name}] must start with {LMQ_PREFIX} followed by a name."
    if len(name.encode("utf-8")) > TOPIC_MAX_LENGTH:
        return f"The specified topic is longer than topic max length {TOPIC_MAX_LENGTH}."
    if not _LMQ_CHARS.fullmatch(name):
        return _illegal_chars("LMQ name", name, _LMQ_CHARS)
    return None


def _illegal_chars(what: str, name: str, chars: re.Pattern) -> str:
    """RocketMQ's reason for a name with characters outside `chars`."""
    return f"The {what}[{name}] contains illegal characters, allowing only ^{chars.pattern}$"


def validate_topic_or_lmq(name: str | None) -> str | None:
    """`validate_lmq` for an LMQ name, else `validate_topic`."""
    if name and is_lmq(name):
        return validate_lmq(name)
    return validate_topic(name)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_system_topic(topic: str) -> bool:
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def is_system_group(group: str) -> bool:
    return group.startswith(SYSTEM_GROUP_PREFIX) or group in (
        DEFAULT_PRODUCER_GROUP,
        DEFAULT_CONSUMER_GROUP,
        TOOLS_CONSUMER_GROUP,
        CLIENT_INNER_PRODUCER_GROUP,
    )
