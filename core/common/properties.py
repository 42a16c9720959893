"""Message property names and the properties string codec (docs/protocol.md §7.4).

On the wire and in stored records properties are UTF-8 text of `name\\x01value\\x02`
pairs. Java drops the final separator and the C++ client keeps it, so the parser accepts
both; like Java, pairs with an empty name or value are skipped.
"""

from __future__ import annotations

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Limit of the PROPERTIESLENGTH field: a signed int16 (docs/protocol.md §7.1).
MAX_PROPERTIES_BYTES = 32767


class MessageConst:
    """Well-known property keys (docs/protocol.md §7.4)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_SWITCH = "TRACE_ON"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
    TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    INSTANCE_ID = "INSTANCE_ID"
    CORRELATION_ID = "CORRELATION_ID"
    MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    MESSAGE_TTL = "TTL"
    REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    CLUSTER = "CLUSTER"
    MESSAGE_TYPE = "MSG_TYPE"
    INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
    INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
    TRANSACTION_ID = "__transactionId__"

    # Separators inside property values.
    KEY_SEPARATOR = " "
    MULTI_DISPATCH_SEPARATOR = ","


def encode_properties(properties: dict[str, str] | None) -> str:
    """Properties dict -> wire string (Java style: no trailing separator)."""
    if not properties:
        return ""
    return PROPERTY_SEPARATOR.join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in properties.items()
    )


def decode_properties(text: str | None) -> dict[str, str]:
    """Wire string -> properties dict; accepts a trailing separator and skips empty pairs."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            result[name] = value
    return result


def decode_properties_bytes(data: bytes | memoryview) -> dict[str, str]:
    """Stored properties bytes -> dict (invalid UTF-8 is replaced, never raised)."""
    if not data:
        return {}
    return decode_properties(bytes(data).decode("utf-8", "replace"))


def validate_property_name_value(name: str, value: str) -> str | None:
    """Reject separators inside names/values: they would corrupt the encoding."""
    for part in (name, value):
        if NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part:
            return "property names and values must not contain \\x01 or \\x02"
    if not name:
        return "property name must not be empty"
    return None


# ----------------------------------------------------------------- encoded strings
# The store keeps the property strings of batch sub-messages as the producer encoded them
# (as Java's broker does, docs/protocol.md §7.7), so it reads single values out of the bytes instead of
# decoding the whole string into a dict. Both helpers agree with `decode_properties`.


def find_property(raw: bytes, marker: bytes) -> bytes | None:
    """The value `decode_properties` would give for a name in the encoded string `raw`:
    the last pair with that name and a non-empty value. `marker` is the UTF-8 name
    followed by \\x01 (e.g. ``b"TAGS\\x01"``)."""
    m = len(marker)
    end = len(raw)
    while True:
        i = raw.rfind(marker, 0, end)
        if i < 0:
            return None
        if i == 0 or raw[i - 1] == 2:  # a pair starts here (not inside a value)
            j = i + m
            k = raw.find(b"\x02", j)
            value = raw[j:] if k < 0 else raw[j:k]
            if value:
                return value
        end = i + m - 1


def drop_property(raw: bytes, marker: bytes) -> bytes:
    """`raw` without the pairs whose name is `marker` (name + \\x01); the other pairs stay
    byte for byte."""
    parts = []
    start = 0
    m = len(marker)
    i = raw.find(marker)
    while i >= 0:
        if i == 0 or raw[i - 1] == 2:
            parts.append(raw[start:i])
            k = raw.find(b"\x02", i + m)
            if k < 0:
                start = len(raw)
                break
            start = k + 1
            i = raw.find(marker, start)
        else:
            i = raw.find(marker, i + 1)
    if not parts:
        return raw
    parts.append(raw[start:])
    return b"".join(parts)
