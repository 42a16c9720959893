"""Regression tests for the review findings on the MQTT gateway.

A real gateway (embedded name server + broker + gateway) driven by paho and raw-socket
clients, as in the other test_server_* modules. Where a failure cannot be provoked from a
client (a broker that times out after storing, a name server that lists no broker), the
gateway's own broker link is wrapped in its trio thread.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import pytest
import trio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from core.client.model import ClusterInfo
from core.remoting.errors import RemotingTimeoutError
from gateway.mqtt.codec import MqttCodec
from gateway.mqtt.connection import READ_SIZE
from gateway.mqtt.packets import (
    Connack,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Pubrec,
    Suback,
    Subscribe,
    Subscription,
)
from gateway.mqtt.session_store import P_RETAINED
from tests.gateway.mqtt.server_harness import (
    Client,
    GatewayServer,
    RawClient,
    ServeProcess,
    wait_for,
)

OUT_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server():
    # No periodic state flush: what is durable before an acknowledgement must be written
    # by the publish path itself.
    with GatewayServer(max_out_buffer=OUT_LIMIT, state_flush_interval_s=3600) as srv:
        yield srv


def run_async(server: GatewayServer, afn, *args):
    """Run `await afn(*args)` in the gateway's trio thread."""
    return trio.from_thread.run(afn, *args, trio_token=server._token)


def live_conns(server: GatewayServer, client_id: str) -> list:
    return server.call(lambda: [c for c in server.gateway.connections
                                if c.client_id == client_id and not c.closed])


def stuck_subscriber(server: GatewayServer, client_id: str, topic: str) -> RawClient:
    """A v5 client subscribed to `topic` that stops reading once the gateway's write to it
    is stuck (its tiny receive buffer and the server's send buffer full)."""
    raw = RawClient.__new__(RawClient)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    raw.sock, raw.codec, raw.version, raw.pending = sock, MqttCodec(1 << 20, role="client"), 5, []
    assert raw.connect(client_id).reason_code == 0
    raw.send(Subscribe(1, (Subscription(topic, 0),)))
    assert raw.recv_type(Suback).reason_codes == (0,)
    conn = live_conns(server, client_id)[0]
    pub = Client(server.port, f"{client_id}-flood", 5)
    chunk = b"z" * (512 * 1024)
    for _ in range(40):  # 20 MB at most; loopback buffers hold about 4 MB
        pub.publish(topic, chunk, 1)
        if conn._writing:
            time.sleep(0.3)
            if conn._writing:  # still on the same write: the socket is full
                break
    else:
        pytest.fail("the gateway's write to the subscriber never blocked")
    pub.disconnect()
    return raw


def queue_pingresps(server: GatewayServer, raw: RawClient, client_id: str, size: int) -> object:
    """Send `size` bytes of PINGREQs to a stuck subscriber; returns its server connection
    once more than `OUT_LIMIT` bytes of PINGRESP wait in its output buffer."""
    conn = live_conns(server, client_id)[0]
    pings = bytes((0xC0, 0)) * 16384
    raw.sock.settimeout(5)
    sent = 0
    try:
        while sent < size:
            raw.sock.sendall(pings)
            sent += len(pings)
    except TimeoutError:
        pass  # the gateway stopped reading
    assert wait_for(lambda: server.call(lambda: conn.out_bytes) > OUT_LIMIT)
    return conn


# -- 1. concurrent takeovers ---------------------------------------------------------------


def test_two_takeovers_at_once_leave_one_connection(server):
    cid = "race-id"
    a = stuck_subscriber(server, cid, "race/t")
    # Output waiting for a full socket: a's final write takes the whole close grace.
    queue_pingresps(server, a, cid, 4 * OUT_LIMIT)
    b = RawClient(server.port, 5)
    c = RawClient(server.port, 5)
    b.send(_connect(cid))
    time.sleep(0.2)  # b waits for a to wind down; c arrives meanwhile
    c.send(_connect(cid))
    assert isinstance(b.recv_type(Connack), Connack)
    assert isinstance(c.recv_type(Connack), Connack)
    outcomes = []
    for raw in (b, c):
        try:
            p = raw.recv(timeout=1.5)
        except TimeoutError:
            outcomes.append("alive")
            continue
        assert isinstance(p, Disconnect) and p.reason_code == 0x8E  # taken over
        assert raw.closed()
        outcomes.append("taken over")
    assert sorted(outcomes) == ["alive", "taken over"]
    survivor = (b, c)[outcomes.index("alive")]
    survivor.send(Pingreq())
    assert isinstance(survivor.recv_type(Pingresp), Pingresp)
    conns = live_conns(server, cid)
    assert len(conns) == 1
    assert server.call(lambda: server.gateway.registry.sessions[cid].conn) is conns[0]
    for raw in (a, b, c):
        raw.close()


def _connect(cid: str):
    from gateway.mqtt.packets import NO_PROPERTIES, Connect

    return Connect(cid, 5, True, 60, None, None, None, NO_PROPERTIES)


# -- 2. cluster info without masters -------------------------------------------------------


def test_empty_cluster_info_keeps_the_known_brokers(server):
    link = server.gateway.link
    api = link.client.api
    before = server.call(lambda: list(link.queues))

    async def empty_info():
        return ClusterInfo({}, {})

    server.call(setattr, api, "get_cluster_info", empty_info)
    try:
        run_async(server, link.refresh_cluster)  # a restarted name server, no broker yet
    finally:
        server.call(delattr, api, "get_cluster_info")
    assert server.call(lambda: list(link.queues)) == before
    sub = Client(server.port, "empty-ci-sub", 5)
    sub.subscribe("emptyci/t", 1)
    pub = Client(server.port, "empty-ci-pub", 5)
    pub.publish("emptyci/t", b"still stored", 1)
    assert sub.get().payload == b"still stored"
    sub.disconnect()
    pub.disconnect()


def test_no_known_broker_fails_publishes_instead_of_crashing(server):
    link = server.gateway.link
    saved = server.call(lambda: link.queues)
    failed = link.stats["failed"]
    server.call(setattr, link, "queues", [])
    try:
        raw = RawClient(server.port, 5)
        raw.connect("noqueues-pub")
        raw.send(Publish("noq/t", b"q0", 0))  # dropped
        raw.send(Publish("noq/t", b"q1", 1, packet_id=1))
        assert raw.recv_type(Puback).reason_code == 0x80
        raw.send(Publish("noq/t", b"q2", 2, packet_id=2))
        assert raw.recv_type(Pubrec).reason_code == 0x80
        v4 = RawClient(server.port, 4)
        v4.connect("noqueues-pub4")
        v4.send(Publish("noq/t", b"q1", 1, packet_id=1))
        assert v4.closed()  # 3.1.1 cannot say "not stored": closed, the client resends
        assert link.stats["failed"] == failed + 4  # the QoS 0 one dropped and counted
    finally:
        server.call(setattr, link, "queues", saved)
    # The dispatcher survived: the next publish is stored and acknowledged.
    raw.send(Publish("noq/t", b"q3", 1, packet_id=3))
    assert raw.recv_type(Puback).reason_code == 0x10  # stored; nobody subscribed
    raw.close()


# -- 3. unknown outcome of a send ----------------------------------------------------------


def test_send_timing_out_after_store_is_not_stored_twice(server):
    link = server.gateway.link
    api = link.client.api
    sub = Client(server.port, "dup-store-sub", 5)
    sub.subscribe("dupstore/t", 2)
    pub = RawClient(server.port, 5)
    pub.connect("dup-store-pub")
    pub.send(Publish("dupstore/t", b"m0", 2, packet_id=1))
    assert pub.recv_type(Pubrec).reason_code == 0
    assert sub.get().payload == b"m0"  # the LMQ tail is known from here on
    local = link.local_send
    server.call(setattr, link, "local_send", None)  # the request path (as over TCP)
    real = api.send_message
    calls = []

    async def stores_then_times_out(*args, **kw):
        calls.append(1)
        await real(*args, **kw)
        raise RemotingTimeoutError("no response within 5 s")

    server.call(setattr, api, "send_message", stores_then_times_out)
    try:
        pub.send(Publish("dupstore/t", b"m1", 2, packet_id=2))
        # Stored, but the gateway cannot know it: a failure rather than a second copy.
        assert pub.recv_type(Pubrec).reason_code == 0x80
    finally:
        server.call(delattr, api, "send_message")
        server.call(setattr, link, "local_send", local)
    assert calls == [1]  # not sent again
    pub.send(Publish("dupstore/t", b"m2", 2, packet_id=3))
    assert pub.recv_type(Pubrec).reason_code == 0
    assert [m.payload for m in sub.get_all(2)] == [b"m1", b"m2"]
    assert sub.none()
    pub.close()
    sub.disconnect()


# -- 4. outbound topic alias of a discarded packet -----------------------------------------


def test_alias_of_a_packet_too_large_for_the_client_is_not_kept(server):
    props = PahoProperties(PacketTypes.CONNECT)
    props.MaximumPacketSize = 300
    props.TopicAliasMaximum = 5
    sub = Client(server.port, "alias-big-sub", 5, properties=props)
    sub.subscribe("aliasbig/t", 1)
    pub = Client(server.port, "alias-big-pub", 5)
    pub.publish("aliasbig/t", b"x" * 1000, 1)  # over the client's maximum: not sent
    pub.publish("aliasbig/t", b"small", 1)
    pub.publish("aliasbig/t", b"again", 1)
    first, second = sub.get_all(2)
    assert first.payload == b"small"
    assert first.topic == "aliasbig/t"  # the alias is introduced with its topic
    assert first.properties.TopicAlias == 1
    assert second.payload == b"again" and second.properties.TopicAlias == 1
    assert sub.none()
    sub.disconnect()
    pub.disconnect()


# -- 5. retained messages are durable before the acknowledgement ---------------------------


def test_retained_publish_is_written_before_its_puback(server):
    store = server.gateway.store
    raw = RawClient(server.port, 5)
    raw.connect("retained-durable")
    raw.send(Publish("rdur/t", b"kept", 1, retain=True, packet_id=1))
    assert raw.recv_type(Puback).reason_code in (0, 0x10)
    key = P_RETAINED + b"rdur/t"
    # In RocksDB (WAL) already, not staged for a flush that a kill -9 would lose.
    assert server.call(lambda: key not in store._staged and store.db.get(key) is not None)
    raw.send(Publish("rdur/t", b"", 1, retain=True, packet_id=2))  # delete
    raw.recv_type(Puback)
    assert server.call(lambda: key not in store._staged and store.db.get(key) is None)
    raw.close()


@pytest.mark.slow
def test_retained_publish_survives_kill_9_right_after_puback():
    d = tempfile.mkdtemp(prefix="lmq-mqtt-test-")
    cfg = os.path.join(d, "mqtt.toml")
    os.makedirs(d, exist_ok=True)
    with open(cfg, "w") as fh:
        fh.write("state_flush_interval_s = 3600\n")
    first = ServeProcess(d, ["--mqtt-config", cfg])
    try:
        first.start()
        pub = Client(first.mqtt_port, "rkill-pub", 5)
        pub.publish("rkill/t", b"acknowledged", 1, retain=True)
        first.kill9()
        with first.restarted() as second:
            sub = Client(second.mqtt_port, "rkill-sub", 5)
            sub.subscribe("rkill/t", 1)
            got = sub.get()
            assert got.payload == b"acknowledged" and got.retain
            sub.disconnect()
    finally:
        first.kill9()
        shutil.rmtree(d, ignore_errors=True)


# -- 6. max_connections counts sockets from accept ------------------------------------------


def test_max_connections_closes_extra_sockets_before_connect():
    with GatewayServer(max_connections=2) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                for _ in range(2)]
        assert wait_for(lambda: srv.gateway.stats.connections == 2)
        third = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            assert third.recv(1) == b""  # closed by the server, nothing sent
        except ConnectionResetError:
            pass
        third.close()
        idle[0].close()
        assert wait_for(lambda: srv.gateway.stats.connections == 1)
        ok = RawClient(srv.port, 5)
        assert ok.connect("maxconn-ok").reason_code == 0
        ok.close()
        idle[1].close()


# -- 7. acknowledgements do not pile up behind a stuck write --------------------------------


def test_reader_stops_while_output_waits_for_a_stuck_write(server):
    raw = stuck_subscriber(server, "stuck-reader", "stuck/t")
    # 1 MB of PINGREQs: each asks for a PINGRESP the client will not read.
    conn = queue_pingresps(server, raw, "stuck-reader", 1 << 20)
    time.sleep(1.0)  # let the reader go on if it would
    queued = server.call(lambda: conn.out_bytes)
    assert queued <= OUT_LIMIT + READ_SIZE
    assert not conn.closed
    raw.close()
    assert wait_for(lambda: not live_conns(server, "stuck-reader"))
