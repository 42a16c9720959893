"""AMQP 0-9-1 reply codes and the protocol error the codec raises.

Reply codes are the ones the 0-9-1 specification defines (section "Constants"); a fault
carries the code the peer must be closed with, and whether it closes the channel
(soft error) or the whole connection (hard error).
"""

from __future__ import annotations

__all__ = ["AmqpError", "BadProtocolHeader"]

REPLY_SUCCESS = 200
# Channel-level (soft) errors: Channel.Close, the connection stays up.
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
# Connection-level (hard) errors: Connection.Close.
CONNECTION_FORCED = 320
INVALID_PATH = 402
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

SOFT_ERRORS = frozenset({CONTENT_TOO_LARGE, NO_ROUTE, NO_CONSUMERS, ACCESS_REFUSED,
                         NOT_FOUND, RESOURCE_LOCKED, PRECONDITION_FAILED})


class AmqpError(Exception):
    """A protocol fault: close the channel (soft) or the connection (hard) with `reply_code`.

    `class_id`/`method_id` name the method that caused it (0 when it was not a method),
    as Channel.Close / Connection.Close report them.
    """

    def __init__(self, reply_code: int, text: str, channel: int = 0,
                 class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(f"{reply_code} {text}")
        self.reply_code = reply_code
        self.text = text
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id

    @property
    def connection_level(self) -> bool:
        """True when the whole connection must close (a hard error, or any fault on channel 0)."""
        return self.reply_code not in SOFT_ERRORS or self.channel == 0


class BadProtocolHeader(AmqpError):
    """The first 8 octets were not AMQP 0-9-1's header: send `reply` and close the socket
    (spec section 4.2.2; no Connection.Close, the peer may not speak this protocol)."""

    def __init__(self, received: bytes, reply: bytes) -> None:
        super().__init__(FRAME_ERROR, f"bad protocol header {received!r}")
        self.received = received
        self.reply = reply
