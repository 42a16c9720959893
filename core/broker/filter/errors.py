"""The one exception of the filter package."""

from __future__ import annotations

from core.remoting.codes import ResponseCode


class FilterParseError(ValueError):
    """A subscription expression (tag or SQL92) cannot be compiled.

    The broker answers such a pull or heartbeat with ``response_code``
    (SUBSCRIPTION_PARSE_FAILED = 23, docs/protocol.md §5.2 "bad expression → 23") and
    ``str(exc)`` as the remark.
    """

    response_code: int = ResponseCode.SUBSCRIPTION_PARSE_FAILED

    def __init__(self, message: str, position: int | None = None) -> None:
        if position is not None:
            message = f"{message} (at position {position})"
        super().__init__(message)
        self.position = position
