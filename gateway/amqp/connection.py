"""Sans-IO AMQP 0-9-1 server connection: the handshake, channels, close and heartbeats.

`ServerConnection` turns received bytes into application events and queues the bytes to
send; it never touches a socket or a clock. The driver passes the current time (seconds,
any monotonic origin) to `receive_data` and `tick`, writes `data_to_send()`, and closes
the socket once `terminated` is true (after a lingering close it waits a little first, so
the peer can read Connection.Close).

Handshake (spec section 2.2.4): protocol header -> Start; Start-Ok (PLAIN or AMQPLAIN) ->
`LoginRequest` event; the driver checks the credentials off the event loop and calls
`login(ok)`; -> Tune; Tune-Ok (channel_max, frame_max, heartbeat negotiated) ; Open with a
vhost -> Open-Ok and `ConnectionOpened`.

Heartbeats: with a negotiated interval H, a heartbeat frame is sent when nothing else was
sent for H seconds, and the connection is dropped when nothing at all was received for 2 H
(two missed heartbeats), as RabbitMQ does.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

from gateway.amqp import errors
from gateway.amqp.codec import (
    DEFAULT_FRAME_MAX,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    AmqpDecoder,
    ChannelFault,
    Content,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
    encode_method_frame,
)
from gateway.amqp.errors import AmqpError, BadProtocolHeader
from gateway.amqp.fields import decode_table
from gateway.amqp.methods import (
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    Method,
)

__all__ = ["ServerConnection", "LoginRequest", "ConnectionOpened", "ChannelOpened",
           "ChannelClosed", "MethodReceived", "ContentReceived", "ConnectionEnded"]

#: RabbitMQ's defaults: 2047 channels per connection, 60 s heartbeat.
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
MECHANISMS = ("PLAIN", "AMQPLAIN")

#: What RabbitMQ advertises in Connection.Start's capabilities, limited to what we provide.
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


class LoginRequest(NamedTuple):
    """Check these credentials (off the event loop) and call `login(ok)`."""

    mechanism: str
    username: str
    password: str


class ConnectionOpened(NamedTuple):
    username: str
    vhost: str
    client_properties: dict[str, Any]


class ChannelOpened(NamedTuple):
    channel: int


class ChannelClosed(NamedTuple):
    channel: int
    reply_code: int
    reply_text: str
    by_peer: bool


class MethodReceived(NamedTuple):
    """A method on an open channel that the application handles (queues, exchanges, basic)."""

    channel: int
    method: Method


class ContentReceived(NamedTuple):
    content: Content


class ConnectionEnded(NamedTuple):
    """The connection is over: close the socket once `data_to_send()` is flushed."""

    reply_code: int
    reply_text: str
    by_peer: bool


class _State(Enum):
    HEADER = 1
    START_OK = 2
    LOGIN = 3
    TUNE_OK = 4
    OPEN = 5
    RUNNING = 6
    CLOSING = 7  # we sent Connection.Close, waiting for Close-Ok
    ENDED = 8


class ServerConnection:
    """Server side of one AMQP connection, without I/O."""

    def __init__(
        self,
        *,
        vhost_exists: Callable[[str], bool | str] = lambda vhost: vhost == "/",
        channel_max: int = DEFAULT_CHANNEL_MAX,
        frame_max: int = DEFAULT_FRAME_MAX,
        heartbeat: int = DEFAULT_HEARTBEAT,
        server_properties: dict[str, Any] | None = None,
        now: float = 0.0,
    ) -> None:
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.decoder = AmqpDecoder(role="server", frame_max=FRAME_MIN_SIZE)
        self.username = ""
        self.vhost = ""
        self.terminated = False
        #: Set by the driver: the peer connected from a loopback address.
        self.peer_loopback = False
        self._vhost_exists = vhost_exists
        self._server_properties = server_properties or {
            "product": "lmq-gateway", "platform": "Python", "capabilities": CAPABILITIES,
        }
        self._state = _State.HEADER
        self._out: list[bytes] = []
        self._channels: dict[int, bool] = {}  # channel -> closing (we sent Channel.Close)
        self._client_properties: dict[str, Any] = {}
        self._closed_channels: list[ChannelClosed] = []  # closes we started, to report
        self._last_recv = now
        self._last_send = now
        self._now = now

    # ------------------------------------------------------------ driver interface

    def data_to_send(self) -> bytes:
        data = b"".join(self._out)
        self._out.clear()
        return data

    @property
    def has_output(self) -> bool:
        """Octets are queued (`data_to_send` would return some)."""
        return bool(self._out)

    def receive_data(self, data: bytes, now: float) -> list[Any]:
        """Feed received octets (b"" = the peer closed its side)."""
        events: list[Any] = []
        if self._state is _State.ENDED:
            return events
        self._last_recv = self._now = now
        if not data:
            self._end(events, errors.CONNECTION_FORCED, "peer closed the socket", by_peer=True)
            return events
        try:
            frames = self.decoder.feed(data)
        except BadProtocolHeader as exc:
            self._out.append(exc.reply)
            self._end(events, exc.reply_code, exc.text, by_peer=False)
            return events
        except AmqpError as exc:
            self.close(exc.reply_code, exc.text, exc.class_id, exc.method_id)
            return events
        channels = self._channels
        for frame in frames:
            state = self._state
            kind = type(frame)
            if (kind is Content or kind is MethodFrame) and state is _State.RUNNING and \
                    channels.get(frame.channel) is False:
                # _handle's answers on an open channel, without the walk: content, and
                # the methods of classes it passes on (exchange, queue, basic, confirm, tx)
                if kind is Content:
                    events.append(ContentReceived(frame))
                    continue
                if frame.method.CLASS_ID >= 40:
                    events.append(MethodReceived(frame.channel, frame.method))
                    continue
            if state is _State.ENDED:
                break
            try:
                self._handle(frame, events)
            except AmqpError as exc:
                if exc.connection_level:
                    self.close(exc.reply_code, exc.text, exc.class_id, exc.method_id)
                else:
                    self.close_channel(exc.channel, exc.reply_code, exc.text,
                                       exc.class_id, exc.method_id)
        if self._closed_channels:
            events.extend(self._closed_channels)
            self._closed_channels.clear()
        return events

    def tick(self, now: float) -> list[Any]:
        """Timer: send a heartbeat when due; end the connection after two missed ones."""
        events: list[Any] = []
        self._beat(now, events)
        if self._closed_channels:
            events.extend(self._closed_channels)
            self._closed_channels.clear()
        return events

    def beat(self, now: float) -> bool:
        """`tick` for a timer task of its own (the server's deadline keeper): heartbeat
        sending and missed heartbeats only (the events of channels closed meanwhile stay
        for the reader's next `receive_data`). True when the connection just ended."""
        return self._beat(now, [])

    def _beat(self, now: float, events: list[Any]) -> bool:
        self._now = now
        if not self._heartbeating():
            return False
        if now - self._last_recv >= 2 * self.heartbeat:
            self._end(events, errors.CONNECTION_FORCED, "missed heartbeats from client",
                      by_peer=False)
            return True
        if now - self._last_send >= self.heartbeat:
            self._out.append(HEARTBEAT_FRAME)
            self._last_send = now
        return False

    def drop(self, text: str) -> None:
        """The driver gives up on the connection (a handshake or close deadline passed):
        it is over without another frame; `terminated` is true."""
        if self._state is not _State.ENDED:
            self._end([], errors.CONNECTION_FORCED, text, by_peer=False)

    def next_deadline(self) -> float | None:
        """When `tick` should next be called (None: no heartbeats)."""
        if not self._heartbeating():
            return None
        return min(self._last_send + self.heartbeat, self._last_recv + 2 * self.heartbeat)

    def login(self, ok: bool, now: float | None = None) -> None:
        """The answer to a `LoginRequest`."""
        if now is not None:
            self._now = now
        if self._state is not _State.LOGIN:
            return  # the connection ended (or failed) while the credentials were checked
        if not ok:
            # authentication_failure_close: a Connection.Close with 403 that pika reports
            # as an authentication error.
            self.close(errors.ACCESS_REFUSED, "ACCESS_REFUSED - Login was refused using "
                       f"authentication mechanism {self._mechanism}")
            return
        self._state = _State.TUNE_OK
        self.send(0, ConnectionTune(self.channel_max, self.frame_max, self.heartbeat))

    def send(self, channel: int, method: Method) -> None:
        self._out.append(encode_method_frame(channel, method))
        self._last_send = self._now

    def send_raw(self, data: bytes) -> None:
        """Queue already-encoded frames (e.g. a method with its content)."""
        self._out.append(data)
        self._last_send = self._now

    def send_parts(self, parts: list) -> None:
        """Queue already-encoded frames given in pieces (joined once, when written)."""
        self._out += parts
        self._last_send = self._now

    def close(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Start a connection-level close (Connection.Close, then wait for Close-Ok)."""
        if self._state in (_State.CLOSING, _State.ENDED):
            return
        self.send(0, ConnectionClose(reply_code, text[:255], class_id, method_id))
        self._state = _State.CLOSING

    def close_channel(self, channel: int, reply_code: int, text: str, class_id: int = 0,
                      method_id: int = 0) -> None:
        """Close one channel with a soft error; its frames are ignored until Close-Ok.
        A `ChannelClosed` event (by_peer False) follows from `receive_data` or `tick`."""
        if self._channels.get(channel) is False:
            self._channels[channel] = True
            self.send(channel, ChannelClose(reply_code, text[:255], class_id, method_id))
            self._closed_channels.append(ChannelClosed(channel, reply_code, text, False))

    # ------------------------------------------------------------ internals

    _mechanism = ""

    def _heartbeating(self) -> bool:
        # Heartbeats run from Tune-Ok (the interval is agreed) until the connection ends.
        return bool(self.heartbeat) and self._state in (_State.OPEN, _State.RUNNING,
                                                        _State.CLOSING)

    @property
    def closing(self) -> bool:
        """We sent Connection.Close and wait for Close-Ok: the driver bounds this wait (a
        lingering close) and then closes the socket."""
        return self._state is _State.CLOSING

    def _end(self, events: list[Any], code: int, text: str, by_peer: bool) -> None:
        self._state = _State.ENDED
        self.terminated = True
        self._channels.clear()
        events.append(ConnectionEnded(code, text, by_peer))

    def _handle(self, frame: Any, events: list[Any]) -> None:
        state = self._state
        if type(frame) is Heartbeat:
            return
        if type(frame) is ProtocolHeader:
            self._state = _State.START_OK
            self.send(0, ConnectionStart(0, 9, self._server_properties,
                                         " ".join(MECHANISMS).encode(), b"en_US"))
            return
        if state is _State.CLOSING:
            # Spec 2.2.4: after sending Close, discard everything but Close / Close-Ok.
            if type(frame) is MethodFrame and frame.channel == 0:
                if isinstance(frame.method, ConnectionCloseOk):
                    self._end(events, errors.REPLY_SUCCESS, "closed", by_peer=False)
                elif isinstance(frame.method, ConnectionClose):
                    self.send(0, ConnectionCloseOk())
            return
        if type(frame) is ChannelFault:
            if frame.channel not in self._channels:
                raise AmqpError(errors.CHANNEL_ERROR, f"CHANNEL_ERROR - content on channel "
                                f"{frame.channel}, which is not open", 0, 60, 40)
            raise frame.error
        if type(frame) is Content:
            self._channel_frame(frame.channel, frame.method, events, frame)
            return
        channel, method = frame.channel, frame.method
        if channel != 0:
            if state is not _State.RUNNING:
                raise AmqpError(errors.UNEXPECTED_FRAME, f"{method.NAME} on channel {channel} "
                                "before the connection is open", 0, method.CLASS_ID,
                                method.METHOD_ID)
            self._channel_frame(channel, method, events, None)
            return
        self._connection_method(method, events)

    def _connection_method(self, method: Method, events: list[Any]) -> None:
        state = self._state
        expected = {_State.START_OK: ConnectionStartOk, _State.TUNE_OK: ConnectionTuneOk,
                    _State.OPEN: ConnectionOpen}.get(state)
        if isinstance(method, ConnectionClose):
            self.send(0, ConnectionCloseOk())
            self._end(events, method.reply_code, method.reply_text, by_peer=True)
            return
        if expected is None and state is _State.RUNNING and method.CLASS_ID == 10 and \
                not isinstance(method, ConnectionCloseOk):
            raise AmqpError(errors.NOT_IMPLEMENTED, f"{method.NAME} is not supported", 0,
                            method.CLASS_ID, method.METHOD_ID)
        if expected is None or not isinstance(method, expected):
            # RabbitMQ answers any method out of the handshake order, and any other method
            # on channel 0, with 504 CHANNEL_ERROR.
            raise AmqpError(errors.CHANNEL_ERROR, f"CHANNEL_ERROR - unexpected {method.NAME} "
                            f"on channel 0 in state {state.name.lower()}", 0,
                            method.CLASS_ID, method.METHOD_ID)
        if isinstance(method, ConnectionStartOk):
            self._start_ok(method, events)
        elif isinstance(method, ConnectionTuneOk):
            self._tune_ok(method)
        else:
            access = self._vhost_exists(method.virtual_host)
            if isinstance(access, str):  # the vhost exists, this user may not use it
                raise AmqpError(errors.NOT_ALLOWED, access, 0, 10, 40)
            if not access:
                raise AmqpError(errors.NOT_ALLOWED, f"NOT_ALLOWED - vhost "
                                f"{method.virtual_host} not found", 0, 10, 40)
            self.vhost = method.virtual_host
            self._state = _State.RUNNING
            self.send(0, ConnectionOpenOk())
            events.append(ConnectionOpened(self.username, self.vhost, self._client_properties))

    def _start_ok(self, method: ConnectionStartOk, events: list[Any]) -> None:
        self._client_properties = method.client_properties or {}
        self._mechanism = method.mechanism
        response = method.response
        if method.mechanism == "PLAIN":
            # RFC 4616: [authzid] NUL authcid NUL passwd
            parts = response.split(b"\x00")
            if len(parts) != 3:
                raise AmqpError(errors.SYNTAX_ERROR, "SYNTAX_ERROR - malformed PLAIN "
                                "response", 0, 10, 11)
            user, password = parts[1], parts[2]
        elif method.mechanism == "AMQPLAIN":
            # A field table without its length prefix, with LOGIN and PASSWORD entries.
            table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
            user, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        else:
            raise AmqpError(errors.COMMAND_INVALID, f"unknown authentication mechanism "
                            f"{method.mechanism!r}", 0, 10, 11)
        as_text = lambda v: v if isinstance(v, str) else bytes(v).decode("utf-8", "replace")  # noqa: E731
        self.username = as_text(user)
        self._state = _State.LOGIN
        events.append(LoginRequest(method.mechanism, self.username, as_text(password)))

    def _tune_ok(self, method: ConnectionTuneOk) -> None:
        # As RabbitMQ: 0 ("no limit") or more than offered is refused when we offered a
        # limit, and so is a non-zero value below the protocol minimum.
        channel_max = method.channel_max
        if channel_max == 0 or channel_max > self.channel_max:
            raise AmqpError(errors.NOT_ALLOWED, f"channel_max={channel_max} exceeds the "
                            f"server limit {self.channel_max}", 0, 10, 31)
        frame_max = method.frame_max
        if frame_max == 0 or frame_max > self.frame_max:
            raise AmqpError(errors.NOT_ALLOWED, f"frame_max={frame_max} exceeds the server "
                            f"limit {self.frame_max}", 0, 10, 31)
        if frame_max < FRAME_MIN_SIZE:
            raise AmqpError(errors.NOT_ALLOWED, f"frame_max={frame_max} is below the minimum "
                            f"{FRAME_MIN_SIZE}", 0, 10, 31)
        self.channel_max, self.frame_max = channel_max, frame_max
        self.heartbeat = method.heartbeat  # the client's choice; 0 switches heartbeats off
        self.decoder.frame_max = frame_max
        self._state = _State.OPEN

    def _channel_frame(self, channel: int, method: Method, events: list[Any],
                       content: Content | None) -> None:
        closing = self._channels.get(channel)
        if closing:
            # We sent Channel.Close: ignore everything but Close-Ok (and a crossing Close).
            if isinstance(method, ChannelCloseOk):
                del self._channels[channel]
            elif isinstance(method, ChannelClose):
                self.send(channel, ChannelCloseOk())
            return
        if closing is None:
            if not isinstance(method, ChannelOpen):
                raise AmqpError(errors.CHANNEL_ERROR, f"CHANNEL_ERROR - expected "
                                f"'channel.open' on channel {channel}, got {method.NAME}", 0,
                                method.CLASS_ID, method.METHOD_ID)
            if channel > self.channel_max:
                raise AmqpError(errors.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {channel} is "
                                f"above channel_max {self.channel_max}", 0, 20, 10)
            self._channels[channel] = False
            self.send(channel, ChannelOpenOk())
            events.append(ChannelOpened(channel))
            return
        if isinstance(method, ChannelOpen):
            raise AmqpError(errors.CHANNEL_ERROR, f"CHANNEL_ERROR - second 'channel.open' on "
                            f"channel {channel}", 0, 20, 10)
        if isinstance(method, ChannelClose):
            del self._channels[channel]
            self.send(channel, ChannelCloseOk())
            events.append(ChannelClosed(channel, method.reply_code, method.reply_text, True))
        elif isinstance(method, ChannelCloseOk):
            raise AmqpError(errors.CHANNEL_ERROR, "CHANNEL_ERROR - unexpected channel.close-ok",
                            0, 20, 41)
        elif isinstance(method, ChannelFlow):
            self.send(channel, ChannelFlowOk(method.active))
        elif method.CLASS_ID == 10:
            raise AmqpError(errors.COMMAND_INVALID, f"{method.NAME} on channel {channel}", 0,
                            method.CLASS_ID, method.METHOD_ID)
        elif content is not None:
            events.append(ContentReceived(content))
        else:
            events.append(MethodReceived(channel, method))
