"""Queue arguments (`x-message-ttl`, `x-max-length`, dead-lettering, ...): validation with
RabbitMQ's reply codes, and the dead-lettered copy of a message (docs/amqp.md "Queue
arguments").

`parse_queue_args` checks a Queue.Declare's arguments once; the parsed `QueueArgs` is what
the publish and delivery paths read (plain attributes, no dictionary look-ups per message).
`dead_letter_properties` builds the AMQP properties of a dead-lettered message: the
`x-death` history RabbitMQ keeps (one entry per queue and reason, counted, newest first),
`x-first-death-*` / `x-last-death-*`, and `expiration` removed (kept in the entry as
`original-expiration`) so the copy does not expire again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.amqp import errors
from gateway.amqp.errors import AmqpError
from gateway.amqp.fields import Timestamp
from gateway.amqp.properties import BasicProperties, encode_properties

__all__ = ["QueueArgs", "parse_queue_args", "parse_expiration", "dead_letter_properties",
           "is_cycle", "NO_ARGS", "UNSUPPORTED", "MAX_TTL_MS"]

#: Largest TTL / expiry / length accepted (a field table's signed 64-bit integer).
MAX_TTL_MS = 2 ** 63 - 1
#: Arguments refused because lmq-gateway does not implement them (listed in docs/amqp.md).
UNSUPPORTED = {
    "x-max-priority": "priority queues are not supported",
    "x-max-length-bytes": "only x-max-length (a message count) is applied",
    "x-max-age": "stream queues are not supported",
    "x-stream-max-segment-size-bytes": "stream queues are not supported",
}
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_TYPES = ("classic", "quorum")


@dataclass(frozen=True, slots=True)
class QueueArgs:
    message_ttl: int | None = None       # ms
    expires: int | None = None           # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dlx: str | None = None               # dead-letter exchange ("" = the default exchange)
    dlrk: str | None = None              # dead-letter routing key (None: the message's own)
    single_active: bool = False
    delivery_limit: int | None = None    # returns before a message is dead-lettered

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None

    @property
    def checks_delivery(self) -> bool:
        """Whether a delivery must be checked (TTL, delivery limit) before it goes out;
        per-message `expiration` is checked on every queue."""
        return self.message_ttl is not None or self.delivery_limit is not None


NO_ARGS = QueueArgs()


def _invalid(name: str, arg: str, why: str) -> AmqpError:
    return AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid arg "
                     f"'{arg}' for queue '{name}' in vhost '/': {why}")


def _type_name(value: Any) -> str:
    """RabbitMQ's name of a field-table value's type (widths as our encoder picks)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -2 ** 31 <= value < 2 ** 31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return "void" if value is None else type(value).__name__


def _int_arg(name: str, arg: str, value: Any, *, minimum: int,
             maximum: int = 2 ** 63 - 1) -> int:
    if type(value) is not int:  # bool is an int in Python; RabbitMQ refuses it here
        raise _invalid(name, arg, f'"expected integer, got {_type_name(value)}"')
    if value < minimum:
        what = "value_zero" if value == 0 else "value_negative"
        raise _invalid(name, arg, f"{{{what},{value}}}")
    if value > maximum:
        raise _invalid(name, arg, f"{{value_too_large,{value},{maximum}}}")
    return value


def _str_arg(name: str, arg: str, value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if not isinstance(value, str):
        raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid type "
                        f"'{_type_name(value)}' for arg '{arg}' in queue '{name}' in vhost '/'")
    return value


def parse_queue_args(name: str, arguments: Mapping[str, Any],
                     durable: bool = True, exclusive: bool = False) -> QueueArgs:
    """Validate a Queue.Declare's arguments (406 PRECONDITION_FAILED with RabbitMQ 3.10's
    texts; the unsupported ones are refused with 406 and a reason). Unknown arguments are
    kept and ignored, as RabbitMQ does."""
    if not arguments:
        return NO_ARGS
    for arg, why in UNSUPPORTED.items():
        if arg in arguments:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - argument "
                            f"'{arg}' of queue '{name}' is not supported: {why}")
    kw: dict[str, Any] = {}
    get = arguments.get
    if (v := get("x-queue-type")) is not None:
        qtype = _str_arg(name, "x-queue-type", v)
        if qtype not in QUEUE_TYPES:
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - argument "
                            f"'x-queue-type' of queue '{name}' is not supported: '{qtype}' "
                            "(classic and quorum only)")
        quorum = qtype == "quorum"
        for prop, bad in (("non-durable", not durable), ("exclusive", exclusive)):
            if quorum and bad:
                raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid "
                                f"property '{prop}' for queue '{name}' in vhost '/'")
    else:
        quorum = False
    if (v := get("x-message-ttl")) is not None:
        kw["message_ttl"] = _int_arg(name, "x-message-ttl", v, minimum=0, maximum=MAX_TTL_MS)
    if (v := get("x-expires")) is not None:
        kw["expires"] = _int_arg(name, "x-expires", v, minimum=1, maximum=MAX_TTL_MS)
    if (v := get("x-max-length")) is not None:
        kw["max_length"] = _int_arg(name, "x-max-length", v, minimum=0)
    if (v := get("x-max-length-bytes")) is not None:
        kw["max_length_bytes"] = _int_arg(name, "x-max-length-bytes", v, minimum=0)
    if (v := get("x-delivery-limit")) is not None:
        if not quorum:  # a quorum-queue argument: RabbitMQ refuses it on a classic queue
            raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid arg "
                            f"'x-delivery-limit' for queue '{name}' in vhost '/' of queue "
                            "type rabbit_classic_queue")
        kw["delivery_limit"] = _int_arg(name, "x-delivery-limit", v, minimum=0)
    if (v := get("x-overflow")) is not None:
        mode = _str_arg(name, "x-overflow", v)
        if mode not in OVERFLOW_MODES:
            raise _invalid(name, "x-overflow", "invalid_overflow")
        kw["overflow"] = mode
    if (v := get("x-dead-letter-exchange")) is not None:
        kw["dlx"] = _str_arg(name, "x-dead-letter-exchange", v)
    if (v := get("x-dead-letter-routing-key")) is not None:
        if "dlx" not in kw:
            raise _invalid(name, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
        kw["dlrk"] = _str_arg(name, "x-dead-letter-routing-key", v)
    if (v := get("x-single-active-consumer")) is not None:
        if not isinstance(v, bool):
            raise _invalid(name, "x-single-active-consumer",
                           f"{{unacceptable_type,{_type_name(v)}}}")
        kw["single_active"] = v
    return QueueArgs(**kw) if kw else NO_ARGS


def parse_expiration(value: str | None) -> int | None:
    """A message's `expiration` property as milliseconds (None when absent); RabbitMQ
    takes only a non-negative decimal integer string, anything else is 406 on the
    channel."""
    if value is None:
        return None
    digits = len(value) - len(value.lstrip("0123456789"))
    if value.isascii() and digits == len(value) and 0 < digits <= 19:
        return int(value)
    if value[:1] == "-" and value[1:].isascii() and value[1:].isdigit():
        why = f"{{value_negative,{value}}}"
    elif digits and value.isascii():
        why = f'{{leftover_string,"{value[digits:]}"}}'
    else:
        why = "no_integer"
    raise AmqpError(errors.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid "
                    f"expiration '{value}': {why}")


def _death_table(entry: Any) -> dict | None:
    return entry if isinstance(entry, dict) else None


def dead_letter_properties(props: BasicProperties, reason: str, queue: str, exchange: str,
                           routing_keys: list[str], now_s: float | None = None
                           ) -> tuple[BasicProperties, bytes]:
    """The properties of `props` dead-lettered from `queue` for `reason` (rejected,
    expired, maxlen, delivery_limit), and their encoding."""
    headers = dict(props.headers or {})
    deaths = [d for d in (headers.get("x-death") or []) if _death_table(d) is not None] \
        if isinstance(headers.get("x-death"), list) else []
    stamp = Timestamp(int(now_s if now_s is not None else time.time()))
    found = None
    for i, d in enumerate(deaths):
        if d.get("queue") == queue and d.get("reason") == reason:
            found = deaths.pop(i)
            break
    if found is not None:
        entry = dict(found)
        count = entry.get("count")
        entry["count"] = (count if type(count) is int else 0) + 1
        entry["time"] = stamp
    else:
        entry = {"count": 1, "reason": reason, "queue": queue, "time": stamp,
                 "exchange": exchange, "routing-keys": list(routing_keys)}
        if props.expiration is not None:
            entry["original-expiration"] = props.expiration
    deaths.insert(0, entry)
    headers["x-death"] = deaths
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue
        headers["x-first-death-exchange"] = exchange
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = exchange
    new = props._replace(headers=headers, expiration=None)
    return new, encode_properties(new)


def is_cycle(target_queue: str, deaths: list) -> bool:
    """Whether dead-lettering to `target_queue` closes a cycle with no rejection in it
    (RabbitMQ drops such messages rather than loop for ever). `deaths` is the message's
    x-death list, newest first, already including the current death."""
    for d in deaths:
        if not isinstance(d, dict):
            continue
        if d.get("reason") == "rejected":
            return False
        if d.get("queue") == target_queue:
            return True
    return False
