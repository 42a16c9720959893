"""Option parsing for the `lmq` data source (names and meanings as Spark's Kafka source).

Every option the source or sink does not know is refused with an error that names it, so a
typo (``startingOffset``) fails the query instead of being ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

EARLIEST = -2
LATEST = -1

#: Options the source understands (lower case: Spark hands them over case-insensitively).
SOURCE_OPTIONS = (
    "lmq.namesrv", "subscribe", "subscribePattern", "mqttTopic", "startingOffsets",
    "startingTimestamp", "endingOffsets", "maxOffsetsPerTrigger", "failOnDataLoss",
    "includeHeaders", "commitGroup", "lmq.pullBatchSize", "lmq.requestTimeout", "amqpQueue",
    "lmq.retryTimeoutMs", "lmq.smallBatchRows",
)
#: Default of `lmq.smallBatchRows`: a micro-batch of at most this many messages is read by
#: one Spark task (its queues one after another) instead of one task per queue.
DEFAULT_SMALL_BATCH_ROWS = 4096
#: Options the sink understands.
SINK_OPTIONS = (
    "lmq.namesrv", "topic", "lmq.producerGroup", "lmq.commitTopic", "lmq.requestTimeout",
    "lmq.queryId", "lmq.mqttStoreTopic", "lmq.retryTimeoutMs",
)
#: Spark sets these itself on streaming queries.
_SPARK_INTERNAL = frozenset({"path", "checkpointlocation", "queryid", "__queryid", "queryname"})

#: Longest `subscribePattern` accepted (characters).
MAX_PATTERN_CHARS = 256

#: Messages asked for in one pull (the broker caps it at its max_pull_msg_nums, 32).
DEFAULT_PULL_BATCH = 32


class LmqOptionError(ValueError):
    """A bad or unknown option of the `lmq` data source."""


def check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """The options with lower-case names; an unknown name raises LmqOptionError (Spark
    hands option names over lower-cased, so the error shows them so)."""
    lows = {k.lower() for k in known}
    out: dict[str, str] = {}
    for name, value in options.items():
        low = name.lower()
        if low in _SPARK_INTERNAL:
            continue
        if low not in lows:
            raise LmqOptionError(
                f"unknown option {name!r} for the lmq {what}; known: {', '.join(known)}")
        out[low] = value
    return out


def _bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise LmqOptionError(f"option {name!r} must be true or false, not {value!r}")


def _positive_int(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise LmqOptionError(f"option {name!r} must be a positive integer, not {value!r}") from None
    if n <= 0:
        raise LmqOptionError(f"option {name!r} must be a positive integer, not {value!r}")
    return n


def _non_negative_int(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise LmqOptionError(f"option {name!r} must be milliseconds since the epoch (>= 0), "
                             f"not {value!r}")
    return n


def parse_pattern(value: str) -> re.Pattern:
    """`subscribePattern`: a Python regex matched against whole topic names."""
    if not value:
        raise LmqOptionError("option 'subscribePattern' must not be empty")
    if len(value) > MAX_PATTERN_CHARS:
        raise LmqOptionError(f"option 'subscribePattern' is longer than {MAX_PATTERN_CHARS} "
                             "characters")
    try:
        return re.compile(value)
    except re.error as exc:
        raise LmqOptionError(f"option 'subscribePattern': invalid regex: {exc}") from None


def include_headers(options: Mapping[str, str]) -> bool:
    """`includeHeaders` of raw (any-case) or parsed options."""
    for name, value in options.items():
        if name.lower() == "includeheaders":
            return _bool("includeHeaders", value)
    return False


def parse_offsets(name: str, value: str | None, default: int,
                  allow_earliest: bool = True) -> int | dict[str, dict[str, int]]:
    """``earliest`` / ``latest`` (EARLIEST / LATEST) or JSON per queue:
    ``{"Topic": {"broker-a/0": 12, "1": -2}}`` — a key without ``broker/`` applies to that
    queue id on every broker; -2 means earliest and -1 latest, as in Kafka."""
    if value is None:
        return default
    text = value.strip()
    if text.lower() == "earliest":
        if not allow_earliest:
            raise LmqOptionError(f"option {name!r} cannot be 'earliest'")
        return EARLIEST
    if text.lower() == "latest":
        return LATEST
    try:
        obj = json.loads(text)
    except ValueError:
        raise LmqOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON per queue, not {value!r}") from None
    if not isinstance(obj, dict):
        raise LmqOptionError(f"option {name!r}: JSON must map topics to {{queue: offset}}")
    out: dict[str, dict[str, int]] = {}
    for topic, queues in obj.items():
        if not isinstance(queues, dict):
            raise LmqOptionError(f"option {name!r}: topic {topic!r} must map queues to offsets")
        per: dict[str, int] = {}
        for q, off in queues.items():
            if not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
                raise LmqOptionError(f"option {name!r}: offset of {topic}/{q} must be an integer >= -2")
            if off == EARLIEST and not allow_earliest:
                raise LmqOptionError(f"option {name!r}: -2 (earliest) is not allowed here")
            qid = q.rpartition("/")[2]
            if not qid.isdigit():
                raise LmqOptionError(f"option {name!r}: queue {q!r} must be 'broker/id' or 'id'")
            per[q] = off
        out[str(topic)] = per
    return out


@dataclass(slots=True)
class SourceOptions:
    namesrv: str
    topics: list[str]
    mqtt_filter: str | None
    pattern: re.Pattern | None = None  # subscribePattern: topics re-listed on every trigger
    starting_ts: int | None = None     # startingTimestamp (ms), instead of startingOffsets
    include_headers: bool = False
    commit_group: str | None = None
    starting: int | dict = EARLIEST
    ending: int | dict = LATEST
    max_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    pull_batch: int = DEFAULT_PULL_BATCH
    request_timeout: float = 10.0
    #: lmq.retryTimeoutMs in seconds: how long a lost broker is retried (retry.py)
    retry_timeout: float = 30.0
    #: lmq.smallBatchRows: ranges totalling at most this many messages share one partition
    small_batch_rows: int = DEFAULT_SMALL_BATCH_ROWS
    extra: dict = field(default_factory=dict)


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    opts = check_known(options, SOURCE_OPTIONS, "source")
    namesrv = opts.get("lmq.namesrv", "").strip()
    if not namesrv:
        raise LmqOptionError("option 'lmq.namesrv' is required (name servers, ';'-separated)")
    mqtt_filter = opts.get("mqtttopic")
    topics = [t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()]
    if "amqpqueue" in opts:
        if {"subscribe", "subscribepattern", "mqtttopic"} & set(opts):
            raise LmqOptionError("option 'amqpQueue' excludes 'subscribe', 'subscribePattern' "
                                 "and 'mqttTopic'")
        topics = [amqp_queue_lmq(opts["amqpqueue"])]
    pattern = None
    if "subscribepattern" in opts:
        if "subscribe" in opts:
            raise LmqOptionError("options 'subscribe' and 'subscribePattern' exclude each other")
        pattern = parse_pattern(opts["subscribepattern"])
    if mqtt_filter is not None:
        from spark_sinks.mqtt import validate_filter
        validate_filter(mqtt_filter)
        if not topics and pattern is None:
            topics = ["MQTT_MESSAGES"]  # the gateway's store topic (MqttConfig.store_topic)
    elif not topics and pattern is None:
        raise LmqOptionError("option 'subscribe' (comma-separated topics), option "
                             "'subscribePattern' or option 'mqttTopic' is required")
    starting = parse_offsets("startingOffsets", opts.get("startingoffsets"),
                             LATEST if streaming else EARLIEST)
    starting_ts = None
    if "startingtimestamp" in opts:
        if "startingoffsets" in opts:
            raise LmqOptionError("options 'startingOffsets' and 'startingTimestamp' exclude "
                                 "each other")
        starting_ts = _non_negative_int("startingTimestamp", opts["startingtimestamp"])
    commit_group = opts.get("commitgroup")
    if commit_group is not None:
        if not streaming:
            raise LmqOptionError("option 'commitGroup' is for streaming queries only")
        from core.common.names import is_system_group, validate_group
        err = validate_group(commit_group)
        if err is None and is_system_group(commit_group):
            err = "it is a system group"
        if err is not None:
            raise LmqOptionError(f"option 'commitGroup': {err}")
    if "endingoffsets" in opts and streaming:
        raise LmqOptionError("option 'endingOffsets' is for batch queries only")
    ending = parse_offsets("endingOffsets", opts.get("endingoffsets"), LATEST, allow_earliest=False)
    max_per = opts.get("maxoffsetspertrigger")
    return SourceOptions(
        namesrv=namesrv,
        topics=topics,
        mqtt_filter=mqtt_filter,
        pattern=pattern,
        starting_ts=starting_ts,
        include_headers=include_headers(opts),
        commit_group=commit_group,
        starting=starting,
        ending=ending,
        max_per_trigger=_positive_int("maxOffsetsPerTrigger", max_per) if max_per else None,
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        pull_batch=_positive_int("lmq.pullBatchSize", opts.get("lmq.pullbatchsize",
                                                               str(DEFAULT_PULL_BATCH))),
        request_timeout=float(_positive_int("lmq.requestTimeout",
                                            opts.get("lmq.requesttimeout", "10"))),
        retry_timeout=retry_timeout_s(opts),
        small_batch_rows=_row_count("lmq.smallBatchRows", opts.get(
            "lmq.smallbatchrows", str(DEFAULT_SMALL_BATCH_ROWS))),
    )


def _row_count(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise LmqOptionError(f"option {name!r} must be a number of messages (>= 0), not {value!r}")
    return n


def retry_timeout_s(opts: Mapping[str, str]) -> float:
    """`lmq.retryTimeoutMs` of parsed (lower-case) options, in seconds (0: no retry)."""
    from spark_sinks.retry import DEFAULT_RETRY_TIMEOUT_MS

    value = opts.get("lmq.retrytimeoutms", str(DEFAULT_RETRY_TIMEOUT_MS))
    return _non_negative_ms("lmq.retryTimeoutMs", value) / 1000.0


def _non_negative_ms(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise LmqOptionError(f"option {name!r} must be milliseconds (>= 0), not {value!r}")
    return n


#: Longest AMQP queue name (AMQP 0-9-1 shortstr), in UTF-8 bytes.
MAX_AMQP_QUEUE_BYTES = 255


def amqp_queue_lmq(name: str) -> str:
    """The LMQ topic holding AMQP queue `name` (gateway/routing/lmq_names.py)."""
    from gateway.routing import lmq_names

    if not name or len(name.encode("utf-8", "surrogatepass")) > MAX_AMQP_QUEUE_BYTES:
        raise LmqOptionError(f"option 'amqpQueue' must be 1..{MAX_AMQP_QUEUE_BYTES} bytes")
    return lmq_names.encode(lmq_names.AMQP, name).topic


class LmqDataLossError(RuntimeError):
    """Messages of a planned range are gone and `failOnDataLoss` is true."""
