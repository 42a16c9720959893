"""The sans-IO server connection: handshake, channels, closes and heartbeats, driven with
plain bytes and explicit times (no sockets, no sleeps)."""

from __future__ import annotations

import pika.frame
import pika.spec
import pytest

from gateway.amqp import errors
from gateway.amqp.codec import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AmqpDecoder,
    Heartbeat,
    MethodFrame,
    encode_content,
    encode_method_frame,
)
from gateway.amqp.connection import (
    ChannelClosed,
    ChannelOpened,
    ConnectionEnded,
    ConnectionOpened,
    ContentReceived,
    LoginRequest,
    MethodReceived,
    ServerConnection,
)
from gateway.amqp.fields import encode_table
from gateway.amqp.methods import (
    BasicPublish,
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
    QueueDeclare,
)
from gateway.amqp.properties import BasicProperties


class Peer:
    """The client side: encodes what it sends, decodes what the server wrote."""

    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn
        self.decoder = AmqpDecoder(role="client", frame_max=1 << 20)
        self.now = 0.0

    def send(self, data: bytes) -> list:
        return self.conn.receive_data(data, self.now)

    def method(self, channel: int, method) -> list:
        return self.send(encode_method_frame(channel, method))

    def read(self) -> list:
        data = self.conn.data_to_send()
        off = 0
        while off < len(data):  # pika can read everything the server writes
            used, frame = pika.frame.decode_frame(data[off:])
            assert frame is not None
            off += used
        return self.decoder.feed(data)

    def read_methods(self) -> list:
        return [(f.channel, f.method) for f in self.read() if isinstance(f, MethodFrame)]


def handshake(conn: ServerConnection | None = None, heartbeat: int = 0,
              mechanism: str = "PLAIN", response: bytes = b"\x00guest\x00guest") -> Peer:
    peer = Peer(conn or ServerConnection())
    assert peer.send(PROTOCOL_HEADER) == []
    ((_, start),) = peer.read_methods()
    assert isinstance(start, ConnectionStart)
    (login,) = peer.method(0, ConnectionStartOk({"product": "test"}, mechanism, response))
    assert isinstance(login, LoginRequest)
    peer.conn.login(True)
    ((_, tune),) = peer.read_methods()
    assert isinstance(tune, ConnectionTune)
    assert peer.method(0, ConnectionTuneOk(tune.channel_max, tune.frame_max, heartbeat)) == []
    (opened,) = peer.method(0, ConnectionOpen("/"))
    assert isinstance(opened, ConnectionOpened)
    assert peer.read_methods() == [(0, ConnectionOpenOk())]
    return peer


def closed_with(peer: Peer) -> int:
    methods = peer.read_methods()
    assert isinstance(methods[-1][1], ConnectionClose), methods
    assert peer.conn.closing
    return methods[-1][1].reply_code


# ---------------------------------------------------------------- handshake


def test_start_advertises_mechanisms_and_rabbitmq_capabilities():
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    ((channel, start),) = peer.read_methods()
    assert channel == 0 and (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) == {b"PLAIN", b"AMQPLAIN"}
    caps = start.server_properties["capabilities"]
    for name in ("publisher_confirms", "basic.nack", "consumer_cancel_notify",
                 "exchange_exchange_bindings", "authentication_failure_close",
                 "per_consumer_qos", "connection.blocked"):
        assert caps[name] is True


def test_plain_handshake_negotiates_tune_and_opens():
    conn = ServerConnection(channel_max=100, frame_max=65536)
    peer = Peer(conn)
    peer.send(PROTOCOL_HEADER)
    peer.read()
    events = peer.method(0, ConnectionStartOk({"product": "t"}, "PLAIN", b"\x00alice\x00s3cret"))
    assert events == [LoginRequest("PLAIN", "alice", "s3cret")]
    assert peer.read() == []  # nothing before the credentials are checked
    conn.login(True)
    assert peer.read_methods() == [(0, ConnectionTune(100, 65536, 60))]
    peer.method(0, ConnectionTuneOk(50, 8192, 15))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == (50, 8192, 15)
    assert conn.decoder.frame_max == 8192
    events = peer.method(0, ConnectionOpen("/"))
    assert events == [ConnectionOpened("alice", "/", {"product": "t"})]


def test_amqplain_credentials():
    response = encode_table({"LOGIN": "bob", "PASSWORD": "pw"})[4:]
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    events = peer.method(0, ConnectionStartOk({}, "AMQPLAIN", response))
    assert events == [LoginRequest("AMQPLAIN", "bob", "pw")]


def test_refused_login_closes_with_403_and_waits_for_close_ok():
    conn = ServerConnection()
    peer = Peer(conn)
    peer.send(PROTOCOL_HEADER)
    peer.method(0, ConnectionStartOk({}, "PLAIN", b"\x00guest\x00wrong"))
    peer.read()
    conn.login(False)
    assert closed_with(peer) == errors.ACCESS_REFUSED
    assert not conn.terminated
    (ended,) = peer.method(0, ConnectionCloseOk())
    assert isinstance(ended, ConnectionEnded) and conn.terminated


@pytest.mark.parametrize(("mechanism", "response", "code"), [
    ("EXTERNAL", b"", errors.COMMAND_INVALID),
    ("PLAIN", b"no-nul-separators", errors.SYNTAX_ERROR),
])
def test_bad_start_ok(mechanism, response, code):
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    peer.read()
    assert peer.method(0, ConnectionStartOk({}, mechanism, response)) == []
    assert closed_with(peer) == code


@pytest.mark.parametrize("tune_ok", [ConnectionTuneOk(5000, 131072, 0),
                                     ConnectionTuneOk(0, 131072, 0),
                                     ConnectionTuneOk(10, 1 << 20, 0),
                                     ConnectionTuneOk(10, 0, 0),
                                     ConnectionTuneOk(10, 1024, 0)])
def test_tune_ok_outside_the_offer_is_530(tune_ok):
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    peer.method(0, ConnectionStartOk({}, "PLAIN", b"\x00a\x00b"))
    peer.conn.login(True)
    peer.read()
    peer.method(0, tune_ok)
    assert closed_with(peer) == errors.NOT_ALLOWED


def test_unknown_vhost_is_530():
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    peer.method(0, ConnectionStartOk({}, "PLAIN", b"\x00a\x00b"))
    peer.conn.login(True)
    peer.method(0, ConnectionTuneOk(10, 4096, 0))
    peer.read()
    assert peer.method(0, ConnectionOpen("/nope")) == []
    assert closed_with(peer) == errors.NOT_ALLOWED


def test_methods_out_of_handshake_order():
    # As RabbitMQ: 504 for a connection method out of order, 505 for any channel's frame.
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    peer.read()
    peer.method(0, ConnectionOpen("/"))
    assert closed_with(peer) == errors.CHANNEL_ERROR
    peer = Peer(ServerConnection())
    peer.send(PROTOCOL_HEADER)
    peer.read()
    peer.method(1, ChannelOpen())
    assert closed_with(peer) == errors.UNEXPECTED_FRAME


def test_wrong_protocol_header_gets_ours_and_the_socket_closes():
    conn = ServerConnection()
    (ended,) = conn.receive_data(b"AMQP\x01\x01\x00\x09", 0.0)
    assert isinstance(ended, ConnectionEnded)
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert conn.terminated


# ---------------------------------------------------------------- channels


def test_channel_open_flow_close():
    peer = handshake()
    assert peer.method(1, ChannelOpen()) == [ChannelOpened(1)]
    assert peer.read_methods() == [(1, ChannelOpenOk())]
    peer.method(1, ChannelFlow(False))
    assert peer.read_methods() == [(1, ChannelFlowOk(False))]
    events = peer.method(1, ChannelClose(200, "bye", 0, 0))
    assert events == [ChannelClosed(1, 200, "bye", True)]
    assert peer.read_methods() == [(1, ChannelCloseOk())]
    assert peer.method(1, ChannelOpen()) == [ChannelOpened(1)]  # the number is free again


def test_other_methods_go_to_the_application():
    peer = handshake()
    peer.method(2, ChannelOpen())
    assert peer.method(2, QueueDeclare(queue="q")) == [MethodReceived(2, QueueDeclare(queue="q"))]
    (received,) = peer.send(encode_content(2, BasicPublish(routing_key="q"), BasicProperties(),
                                           b"hello"))
    assert isinstance(received, ContentReceived) and received.content.body == b"hello"


@pytest.mark.parametrize("data", [
    encode_method_frame(3, QueueDeclare(queue="q")),              # channel not open
    encode_method_frame(1, ChannelOpen()) * 2,                    # opened twice
    encode_method_frame(3000, ChannelOpen()),                     # above channel_max
    encode_content(4, BasicPublish(), BasicProperties(), b"x"),   # content on a closed channel
])
def test_channel_misuse_is_504(data):
    peer = handshake()
    peer.send(data)
    assert closed_with(peer) == errors.CHANNEL_ERROR


def test_oversized_message_closes_its_channel_only():
    conn = ServerConnection()
    conn.decoder.max_message_size = 10
    peer = handshake(conn)
    peer.method(1, ChannelOpen())
    peer.method(2, ChannelOpen())
    peer.read()
    events = peer.send(encode_content(1, BasicPublish(), BasicProperties(), b"x" * 11))
    assert len(events) == 1 and events[0][:2] == (1, errors.PRECONDITION_FAILED)
    assert isinstance(events[0], ChannelClosed) and not events[0].by_peer
    ((channel, close),) = peer.read_methods()
    assert channel == 1 and close.reply_code == errors.PRECONDITION_FAILED
    # Until Close-Ok, the closing channel's frames are dropped; channel 2 works.
    assert peer.method(1, QueueDeclare(queue="ignored")) == []
    assert peer.method(2, QueueDeclare(queue="q")) == [MethodReceived(2, QueueDeclare(queue="q"))]
    assert peer.method(1, ChannelCloseOk()) == []
    assert peer.method(1, ChannelOpen()) == [ChannelOpened(1)]


def test_frame_error_closes_the_connection_and_then_input_is_ignored():
    peer = handshake()
    peer.send(b"\x01\x00\x01\x00\x00\x00\x00\xff")  # empty method frame, bad frame-end
    assert closed_with(peer) == errors.FRAME_ERROR
    assert peer.send(encode_method_frame(1, ChannelOpen())) == []
    assert peer.read() == []


def test_client_close_is_answered_and_ends():
    peer = handshake()
    (ended,) = peer.method(0, ConnectionClose(200, "Normal shutdown", 0, 0))
    assert ended == ConnectionEnded(200, "Normal shutdown", True)
    assert peer.read_methods() == [(0, ConnectionCloseOk())]
    assert peer.conn.terminated


def test_server_close_ignores_all_but_close_ok():
    peer = handshake()
    peer.method(1, ChannelOpen())
    peer.read()
    peer.conn.close(errors.CONNECTION_FORCED, "shutting down")
    assert closed_with(peer) == errors.CONNECTION_FORCED
    assert peer.method(1, QueueDeclare(queue="q")) == []
    (ended,) = peer.method(0, ConnectionCloseOk())
    assert isinstance(ended, ConnectionEnded) and not ended.by_peer


def test_pika_reads_refusal_as_authentication_error():
    # pika's own handling of the 403 close sent during the handshake.
    conn = ServerConnection()
    peer = Peer(conn)
    peer.send(PROTOCOL_HEADER)
    peer.method(0, ConnectionStartOk({}, "PLAIN", b"\x00u\x00p"))
    peer.read()
    conn.login(False)
    _, frame = pika.frame.decode_frame(conn.data_to_send())
    assert isinstance(frame.method, pika.spec.Connection.Close)
    assert frame.method.reply_code == 403


# ---------------------------------------------------------------- heartbeats


def test_heartbeat_sent_when_idle_and_connection_dropped_after_two_missed():
    peer = handshake(heartbeat=10)
    conn = peer.conn
    assert conn.next_deadline() == 10
    assert conn.tick(9.9) == [] and conn.data_to_send() == b""
    assert conn.tick(10) == []
    assert peer.decoder.feed(conn.data_to_send()) == [Heartbeat()]
    peer.now = 12
    assert peer.send(HEARTBEAT_FRAME) == []
    assert conn.next_deadline() == 20
    conn.tick(20)
    conn.data_to_send()
    assert conn.tick(31.9) == []
    (ended,) = conn.tick(32)  # nothing received for 2 x 10 s since 12
    assert isinstance(ended, ConnectionEnded) and conn.terminated
    assert conn.next_deadline() is None


def test_any_traffic_counts_as_alive_and_sent_methods_delay_heartbeats():
    peer = handshake(heartbeat=10)
    conn = peer.conn
    peer.now = 8
    peer.method(1, ChannelOpen())  # the server answers Open-Ok at 8
    assert peer.read_methods() == [(1, ChannelOpenOk())]
    assert conn.next_deadline() == 18
    assert conn.tick(17) == [] and conn.data_to_send() == b""
    conn.tick(18)
    assert conn.data_to_send() == HEARTBEAT_FRAME
    assert conn.tick(27.9) == []
    (ended,) = conn.tick(28)
    assert isinstance(ended, ConnectionEnded)


def test_no_heartbeats_when_negotiated_off():
    peer = handshake(heartbeat=0)
    assert peer.conn.next_deadline() is None
    assert peer.conn.tick(10_000) == [] and peer.conn.data_to_send() == b""


def test_login_answer_after_the_client_left_is_ignored():
    # A client pipelines Start-Ok and Close; the credential check finishes afterwards.
    conn = ServerConnection()
    peer = Peer(conn)
    peer.send(PROTOCOL_HEADER)
    peer.read()
    events = peer.send(encode_method_frame(0, ConnectionStartOk({}, "PLAIN", b"\x00a\x00b"))
                       + encode_method_frame(0, ConnectionClose(200, "bye", 0, 0)))
    assert isinstance(events[0], LoginRequest) and isinstance(events[1], ConnectionEnded)
    peer.read()
    conn.login(True)
    assert conn.data_to_send() == b"" and conn.terminated
