"""Exceptions of the remoting layer.

`FrameError` and `HeaderError` belong to the sans-IO codec (no trio); the `Remoting*Error`
family is raised by the transports (client, connections).
"""

from __future__ import annotations


class FrameError(Exception):
    """The byte stream is not a valid remoting frame sequence (docs/protocol.md §1.1).

    The connection it came from cannot be resynchronised and must be closed.
    """


class HeaderError(Exception):
    """A request's ext field is missing or cannot be parsed (docs/protocol.md §1.4).

    Servers answer it with SYSTEM_ERROR and ``str(exc)`` as the remark, as Java does when
    ``decodeCommandCustomHeader`` rejects a request.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{message}: {name}" if name else message)
        self.name = name
        self.message = message


class RemotingError(Exception):
    """Base class of transport failures."""


class RemotingConnectError(RemotingError):
    """The peer could not be reached, or the connection broke before the answer came."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the request timeout."""
