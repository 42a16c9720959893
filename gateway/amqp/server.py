"""A thin trio AMQP 0-9-1 server around `ServerConnection` (the first slice: handshake,
channels, heartbeats and closes; queues and exchanges are not there yet).

Every task lives in the server's nursery (one per connection). Password checks run in a
worker thread (`trio.to_thread`), so a slow check never holds the event loop. Methods the
slice does not implement (queue, exchange, basic, confirm, tx) close the connection with
540 NOT_IMPLEMENTED. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from gateway.amqp import errors
from gateway.amqp.broker import AmqpBroker
from gateway.amqp.codec import DEFAULT_FRAME_MAX, DEFAULT_MAX_MESSAGE_SIZE
from gateway.amqp.connection import (
    DEFAULT_CHANNEL_MAX,
    DEFAULT_HEARTBEAT,
    ConnectionOpened,
    ContentReceived,
    LoginRequest,
    MethodReceived,
    ServerConnection,
)
from gateway.amqp.deadlines import Deadlines
from gateway.amqp.session import AmqpSession
from gateway.amqp.users import UserFile
from gateway.amqp.wire import Wire
from gateway.mqtt.logtext import shown
from gateway.mqtt.transport import server_ssl_context

__all__ = ["AmqpServer", "AmqpServerConfig"]

log = logging.getLogger(__name__)


@dataclass
class AmqpServerConfig:
    """Listener settings and per-connection limits (documented in docs/amqp.md)."""

    host: str = "127.0.0.1"
    port: int = 5672
    channel_max: int = DEFAULT_CHANNEL_MAX
    frame_max: int = DEFAULT_FRAME_MAX
    heartbeat_s: int = DEFAULT_HEARTBEAT
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    #: RabbitMQ's handshake_timeout: header to Open-Ok within this many seconds.
    handshake_timeout_s: float = 10.0
    #: After our Connection.Close, wait this long for Close-Ok before closing the socket.
    close_linger_s: float = 2.0
    max_connections: int = 10_000
    #: As RabbitMQ's loopback_users: user `guest` is accepted from loopback peers only.
    guest_loopback_only: bool = True
    #: After a connection ends, at most this long to drop its exclusive queues' bindings.
    cleanup_timeout_s: float = 5.0
    #: Users, virtual hosts and permissions (JSON, `lmq amqp user ...`); "" = RabbitMQ's
    #: default (vhost "/", guest/guest). Read again when it changes.
    users_file: str = ""
    #: AMQPS (AMQP over TLS) listener: port (5671 by convention; None = none, 0 = a free
    #: one), the certificate chain and private key (PEM files), as the MQTT gateway's.
    tls_port: int | None = None
    certfile: str = ""
    keyfile: str = ""

    def __post_init__(self) -> None:
        if self.tls_port is not None and not (self.certfile and self.keyfile):
            raise ValueError("tls_port needs certfile and keyfile")
    read_size: int = 65536


#: At most one "login refused" line per this many seconds; the next line says how many
#: were left out (a client failing logins in a loop cannot fill the log; docs/amqp.md).
REFUSED_LOGIN_LOG_INTERVAL_S = 1.0


def _peer(stream: Any) -> str:
    try:
        raw = getattr(stream, "transport_stream", stream)
        host, port = raw.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, ValueError, AttributeError, TypeError):
        return "?"


def _is_loopback(stream: Any) -> bool:
    try:
        raw = getattr(stream, "transport_stream", stream)  # under TLS: the TCP stream
        host = raw.socket.getpeername()[0]
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except (OSError, ValueError, AttributeError, IndexError):
        return False


class AmqpServer:
    """`await server.serve(task_status=...)` binds and reports the bound port."""

    def __init__(self, config: AmqpServerConfig | None = None,
                 authenticate: Callable[[str, str], bool] | None = None,
                 vhost_exists: Callable[[str], bool] | None = None,
                 broker: AmqpBroker | None = None) -> None:
        self.config = config or AmqpServerConfig()
        self.broker = broker
        #: The users file (gateway/amqp/users.py) unless a test passes its own checks.
        self.users = UserFile(self.config.users_file or None) \
            if authenticate is None else None
        self.authenticate = authenticate or self.users.authenticate
        self.vhost_exists = vhost_exists
        self.connections = 0
        #: Octets read from / written to AMQP sockets (the metrics port's byte counters).
        self.bytes_in = 0
        self.bytes_out = 0
        #: Live connections' sessions, read by the metrics port (in-flight, consumers).
        self.sessions: set[AmqpSession] = set()
        self.port = 0
        self._refused_logged_at = -REFUSED_LOGIN_LOG_INTERVAL_S  # trio time of the last line
        self._refused_unlogged = 0
        self.tls_port: int | None = None
        self._nursery: trio.Nursery | None = None

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        listeners: list[Any] = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
        self.port = listeners[0].socket.getsockname()[1]
        if cfg.tls_port is not None:
            try:
                ctx = server_ssl_context(cfg.certfile, cfg.keyfile)
                tls = await trio.open_ssl_over_tcp_listeners(cfg.tls_port, ctx, host=cfg.host)
            except BaseException:
                for listener in listeners:
                    await listener.aclose()
                raise
            # The TLS handshake happens on the first read, inside the connection's
            # handshake_timeout_s like everything before Open-Ok.
            self.tls_port = tls[0].transport_listener.socket.getsockname()[1]
            listeners += tls
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # connections and their deadline keepers
            task_status.started(self.port)
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, stream: Any) -> None:
        cfg = self.config
        if self.connections >= cfg.max_connections:
            await stream.aclose()  # before the protocol header: nothing to say yet
            return
        self.connections += 1
        try:
            await self._run(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                raise
        except trio.TooSlowError:
            pass
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    async def _run(self, stream: trio.SocketStream) -> None:
        cfg = self.config
        now = trio.current_time()
        users = self.users
        if self.vhost_exists is not None:
            access = self.vhost_exists
        elif users is not None:
            def access(vhost: str) -> bool | str:
                return users.db.vhost_access(conn.username, vhost)
        else:
            def access(vhost: str) -> bool | str:
                return vhost == "/"
        conn = ServerConnection(vhost_exists=access, channel_max=cfg.channel_max,
                                frame_max=cfg.frame_max, heartbeat=cfg.heartbeat_s, now=now)
        conn.decoder.max_message_size = cfg.max_message_size
        conn.peer_loopback = _is_loopback(stream)
        conn.peer = _peer(stream)
        session = AmqpSession(conn, self.broker) if self.broker is not None else None
        # Consumer loops and store tasks write from their own tasks too.
        wire = Wire(stream, conn.data_to_send, cfg.read_size, self)
        flush = wire.flush

        if session is not None:
            session.flush = flush
            self.sessions.add(session)
        # Heartbeats, the handshake timeout and the close linger: a task of their own,
        # so reads need no cancel scope each (deadlines.py); it ends with this one.
        deadlines = Deadlines(conn, stream, flush, now + cfg.handshake_timeout_s,
                              cfg.close_linger_s)
        assert self._nursery is not None, "connections come from serve()"
        self._nursery.start_soon(deadlines.run)
        try:
            await self._loop(wire, conn, session, flush, deadlines)
        finally:
            deadlines.stop()
            if session is not None:
                self.sessions.discard(session)
                # Bounded: a broker that is gone must not keep the task forever.
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + cfg.cleanup_timeout_s
                    await session.ended()

    async def _loop(self, wire: Wire, conn: ServerConnection,
                    session: AmqpSession | None,
                    flush: Callable[[], Awaitable[None]], deadlines: Deadlines) -> None:
        """Read, handle, write, until the connection ends; waits for octets without a
        timeout (`deadlines` drops the connection when one passes)."""
        receive = wire.receive
        current_time = trio.current_time
        handshake = True
        while not conn.terminated:
            data = await receive()
            self.bytes_in += len(data)
            events = conn.receive_data(data, current_time())
            for event in events:
                kind = type(event)
                if session is not None:
                    # The common publish and ack without a coroutine each.
                    if kind is ContentReceived:
                        if session.publish_now(event.content):
                            continue
                    elif kind is MethodReceived and session.ack_now(event):
                        continue
                await self._event(conn, session, event)
                if kind is ConnectionOpened:
                    handshake = False
                    deadlines.opened()
            if session is not None:
                if session.read_acks:  # in this task: no ack task wake-up per read
                    session.apply_acks()
                await session.store_queued(wire.drained)
            if conn.has_output:  # (an ack's read has nothing to answer)
                await flush()
            if handshake or conn.closing:
                deadlines.update()  # a deadline may have come closer

    def _log_refused_login(self, conn: ServerConnection, username: str, why: str) -> None:
        """One line per refused login, at most one per REFUSED_LOGIN_LOG_INTERVAL_S."""
        now = trio.current_time()
        if now - self._refused_logged_at < REFUSED_LOGIN_LOG_INTERVAL_S:
            self._refused_unlogged += 1
            return
        self._refused_logged_at = now
        skipped, self._refused_unlogged = self._refused_unlogged, 0
        log.info("AMQP login refused for user %s from %s: %s%s", shown(username),
                 getattr(conn, "peer", "?"), why,
                 f" ({skipped} more refused since the last line)" if skipped else "")

    async def _event(self, conn: ServerConnection, session: AmqpSession | None,
                     event: Any) -> None:
        kind = type(event)
        if kind is LoginRequest:
            try:
                ok = await trio.to_thread.run_sync(self.authenticate, event.username,
                                                   event.password)
            except Exception:  # a broken authenticator refuses; it must not stop the server
                log.exception("AMQP authenticator failed")
                ok = False
            why = "wrong user name or password"
            if ok and event.username == "guest" and self.config.guest_loopback_only and \
                    not conn.peer_loopback:
                # RabbitMQ's loopback_users default: guest only from this machine.
                ok = False
                why = "user guest may only connect from loopback"
            if not ok:
                self._log_refused_login(conn, event.username, why)
            conn.login(bool(ok), trio.current_time())
        elif session is not None:
            if kind is ConnectionOpened:
                perms = None if self.users is None else \
                    self.users.db.permissions_of(event.username, event.vhost)
                try:
                    session.opened(event.username, event.vhost, perms)
                except errors.AmqpError as exc:
                    conn.close(exc.reply_code, exc.text, 10, 40)
                return
            await session.handle(event)
        elif kind is MethodReceived or kind is ContentReceived:
            method = event.method if kind is MethodReceived else event.content.method
            conn.close(errors.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {method.NAME} is not "
                       "supported yet", method.CLASS_ID, method.METHOD_ID)
