"""Exceptions raised by the native client.

`MQClientError` is a local failure (bad argument, no route, client state); `MQBrokerError`
carries a broker's response code and remark, so callers can branch on the protocol's own
code (docs/protocol.md §2.2). Transport failures surface as `core.remoting.errors`
exceptions wrapped in `MQClientError` only when every retry has failed.
"""

from __future__ import annotations

from core.remoting.codes import ResponseCode


class MQClientError(Exception):
    """A client-side failure. `code` is a ResponseCode when one applies (e.g. MESSAGE_ILLEGAL
    for a body over the size limit), else -1."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


class MQBrokerError(MQClientError):
    """A broker or name server answered with a non-success code."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None) -> None:
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        where = f" from {addr}" if addr else ""
        super().__init__(f"{name} ({code}){where}: {remark or ''}".rstrip(": "), code)
        self.remark = remark or ""
        self.addr = addr


class NoRouteError(MQClientError):
    """The name servers know no route for a topic (TOPIC_NOT_EXIST)."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"no route info for topic {topic!r} in the name servers", ResponseCode.TOPIC_NOT_EXIST
        )
        self.topic = topic


class ClientStateError(MQClientError):
    """An operation was called on a producer/consumer that is not running."""
