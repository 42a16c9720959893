"""Small helpers shared by the broker's processors."""

from __future__ import annotations

import json
from typing import Any

from core.common import names
from core.remoting.codec import RemotingCommand, java_int
from core.remoting.codes import ResponseCode
from core.remoting.errors import HeaderError


def error(cmd: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    """A failure response with `remark`."""
    return cmd.make_response(code, remark)


def json_body(data: Any) -> bytes:
    """Standard JSON for response bodies (docs/protocol.md §1.4 rule 7): quoted keys, compact, ASCII."""
    return json.dumps(data, separators=(",", ":")).encode("ascii")


def parse_json_body(cmd: RemotingCommand) -> Any:
    """The request body as JSON; HeaderError (-> SYSTEM_ERROR) when it is not."""
    raw = cmd.body_bytes()
    if not raw:
        raise HeaderError("body", "missing request body")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise HeaderError("body", "request body is not valid JSON") from None


_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _ranged(cmd: RemotingCommand, name: str, default, required: bool, bounds, kind: str):
    ext = cmd.ext_fields
    raw = ext.get(name) if ext else None
    if raw is None or raw == "":
        if required:
            raise HeaderError(name, "missing required ext field")
        return default
    try:
        value = java_int(raw)
    except ValueError:
        raise HeaderError(name, f"invalid integer {raw!r} in ext field") from None
    if value is not None and not bounds[0] <= value <= bounds[1]:
        # Java's Integer/Long.parseLong rejects these too (NumberFormatException).
        raise HeaderError(name, f"value {value} out of range for a {kind}")
    return value


def ext_int32(cmd: RemotingCommand, name: str, default: int | None = None,
              required: bool = False) -> int | None:
    """An ext field that is a Java `Integer`: HeaderError when missing (if required),
    not a number, or outside 32 bits."""
    return _ranged(cmd, name, default, required, _INT32, "32-bit integer")


def ext_int64(cmd: RemotingCommand, name: str, default: int | None = None,
              required: bool = False) -> int | None:
    """An ext field that is a Java `Long`."""
    return _ranged(cmd, name, default, required, _INT64, "64-bit integer")


def required_topic(cmd: RemotingCommand, name: str = "topic") -> str:
    """The `name` ext field, checked to be a legal topic or LMQ name (else HeaderError
    naming it)."""
    topic = cmd.ext_str(name, required=True)
    reason = names.validate_topic_or_lmq(topic)
    if reason is not None:
        raise HeaderError(name, reason)
    return topic


def required_group(cmd: RemotingCommand, name: str) -> str:
    group = cmd.ext_str(name, required=True)
    reason = names.validate_group(group)
    if reason is not None:
        raise HeaderError(name, reason)
    return group


def required_queue_id(cmd: RemotingCommand, name: str = "queueId") -> int:
    queue_id = ext_int32(cmd, name, required=True)
    if queue_id < 0:
        raise HeaderError(name, f"illegal queue id {queue_id}")
    return queue_id


def ok(cmd: RemotingCommand, ext: dict[str, str] | None = None, body=None) -> RemotingCommand:
    return cmd.make_response(ResponseCode.SUCCESS, None, ext, body)
