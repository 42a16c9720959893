"""A publisher's reader stores its read's publishes itself when the dispatcher is idle and
delivers them to the subscribers' sockets in the same task step (issue 10, p99 latency at
1k msg/s): a lone publish wakes neither the dispatcher task nor a delivery pump. The
round stays shielded from the publisher's cancellation, and order holds across
publishes stored by readers and by the dispatcher."""

from __future__ import annotations

import collections
import threading

import trio
import trio.testing

from gateway.mqtt import broker_link
from gateway.mqtt.packets import Puback, Publish, Suback, Subscribe, Subscription
from tests.gateway.mqtt.server_harness import GatewayServer, RawClient, wait_for


class _Steps(trio.abc.Instrument):
    """Task steps per task name."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task) -> None:
        self.steps[task.name] += 1


def _quiet(srv: GatewayServer) -> None:
    trio.from_thread.run(trio.testing.wait_all_tasks_blocked, 0.05, trio_token=srv._token)


def _subscriber(srv: GatewayServer, topic_filter: str, qos: int = 1) -> RawClient:
    sub = RawClient(srv.port, 4)
    assert sub.connect("sub").reason_code == 0
    sub.send(Subscribe(1, (Subscription(topic_filter, qos),)))
    assert isinstance(sub.recv_type(Suback), Suback)
    return sub


def _publisher(srv: GatewayServer, client_id: str) -> RawClient:
    pub = RawClient(srv.port, 4)
    assert pub.connect(client_id).reason_code == 0
    return pub


def _one(pub: RawClient, sub: RawClient, pid: int, payload: bytes) -> None:
    """A QoS 1 publish: delivered to `sub` (which acknowledges it), PUBACKed to `pub`."""
    pub.send(Publish("lat/t", payload, 1, packet_id=pid))
    got = sub.recv_type(Publish)
    assert got.payload == payload
    sub.send(Puback(got.packet_id))
    assert pub.recv_type(Puback).packet_id == pid


def _steps_of_lone_publishes(monkeypatch, gap_s: float) -> tuple[int, int, int]:
    """Task steps of (the dispatcher, delivery pumps, connection readers) over 20 QoS 1
    publishes sent one at a time, with `READER_ROUND_GAP_S` set to `gap_s`."""
    monkeypatch.setattr(broker_link, "READER_ROUND_GAP_S", gap_s)
    steps = _Steps()
    with GatewayServer() as srv:
        sub = _subscriber(srv, "lat/t")
        pub = _publisher(srv, "pub")
        _one(pub, sub, 1, b"warm-up")
        _quiet(srv)
        srv.call(trio.lowlevel.add_instrument, steps)
        for i in range(2, 22):
            _one(pub, sub, i, b"m%d" % i)
        _quiet(srv)
        srv.call(trio.lowlevel.remove_instrument, steps)
        pub.close()
        sub.close()
    dispatcher = sum(n for name, n in steps.steps.items() if "BrokerLink.run" in name)
    pumps = sum(n for name, n in steps.steps.items() if "_run_pump" in name)
    readers = sum(n for name, n in steps.steps.items() if "_run_handler" in name)
    return dispatcher, pumps, readers


def test_a_lone_publish_wakes_neither_the_dispatcher_nor_a_pump(monkeypatch):
    # (no round ended just before: the gap is 0 here, whatever the test machine's speed)
    dispatcher, pumps, readers = _steps_of_lone_publishes(monkeypatch, 0.0)
    assert dispatcher == 0 and pumps == 0
    assert readers >= 20  # the publisher's reads (and the subscriber's PUBACK reads)


def test_publishes_close_together_are_batched_by_the_dispatcher(monkeypatch):
    # Every round ended "recently" (a gap of an hour): readers leave the store to the
    # dispatcher, which batches what accumulates, and the pump delivers.
    dispatcher, pumps, readers = _steps_of_lone_publishes(monkeypatch, 3600.0)
    assert dispatcher >= 20 and pumps >= 20


def test_a_reader_round_completes_when_its_connection_is_taken_over(monkeypatch):
    # The store answers late (a transport that waits); meanwhile another connection takes
    # the publisher's client id over, which cancels the first connection's tasks. The
    # message stored must still reach the LMQ's reader, and the next one after it.
    monkeypatch.setattr(broker_link, "READER_ROUND_GAP_S", 0.0)
    with GatewayServer() as srv:
        sub = _subscriber(srv, "lat/t")
        pub = _publisher(srv, "pub")
        srv.gateway.link.local_send = None  # the store request path (as over TCP)
        api = srv.gateway.link.client.api
        send = api.send_message
        entered = threading.Event()
        release = trio.Event()
        held = []

        async def slow_send(*args, **kw):
            result = await send(*args, **kw)
            if not held:
                held.append(1)
                entered.set()
                await release.wait()
            return result

        monkeypatch.setattr(api, "send_message", slow_send)
        pub.send(Publish("lat/t", b"first", 1, packet_id=1))
        assert entered.wait(10)
        old = srv.call(lambda: srv.gateway.registry.sessions["pub"].conn)
        again = RawClient(srv.port, 4)
        from gateway.mqtt.packets import Connect

        again.send(Connect("pub", 4))  # takeover: the first connection is cancelled
        assert wait_for(lambda: srv.call(lambda: old.closed))
        srv.call(release.set)
        assert again.recv().reason_code == 0
        other = _publisher(srv, "pub-b")
        other.send(Publish("lat/t", b"second", 1, packet_id=1))
        got = [sub.recv_type(Publish).payload for _ in range(2)]
        assert got == [b"first", b"second"]
        for c in (sub, pub, again, other):
            c.close()


def test_order_holds_across_reader_rounds_and_dispatcher_rounds(monkeypatch):
    # Reads of 1 to 150 publishes from three publishers: short reads are stored by their
    # reader, long ones pass the dispatcher (a reader yields every PUBLISHES_PER_STEP and
    # waits when more than max_pending_publishes are queued).
    monkeypatch.setattr(broker_link, "READER_ROUND_GAP_S", 0.0)
    with GatewayServer(max_pending_publishes=40) as srv:
        sub = _subscriber(srv, "lat/#", qos=0)
        pubs = [_publisher(srv, f"pub-{k}") for k in range(3)]
        sent = collections.Counter()
        sizes = [1, 150, 2, 70, 1, 1, 90, 3, 1, 40]
        for size in sizes:
            for k, pub in enumerate(pubs):
                data = b"".join(
                    _encode(Publish(f"lat/{k}", b"%d" % (sent[k] + i), 0)) for i in range(size))
                sent[k] += size
                pub.send_raw(data)
        got: dict[str, list[int]] = collections.defaultdict(list)
        for _ in range(sum(sent.values())):
            p = sub.recv_type(Publish)
            got[p.topic].append(int(p.payload))
        for k in range(3):
            assert got[f"lat/{k}"] == list(range(sent[k])), k
        for c in (sub, *pubs):
            c.close()


def _encode(packet) -> bytes:
    from gateway.mqtt._encoding import encode_packet

    return encode_packet(packet, 4)
