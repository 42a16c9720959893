"""The read path of an LMQ that other gateways write (issue 12, gateway/mqtt/lmq_watch.py):
the watch pull brings entries, not just news of them, and reads ahead of a reader that is
behind, so the reader takes them from memory instead of one PULL per `pull_batch`.

A real broker and gateway in one process (server_harness), put in the several-gateways
mode (`share_lmqs`, as when another gateway joins): its readers then learn of writes only
through the watch, exactly as on a second gateway. Real paho clients over TCP.
"""

from __future__ import annotations

from gateway.mqtt import lmq_watch
from tests.gateway.mqtt.e2e_support import Client, uid
from tests.gateway.mqtt.server_harness import GatewayServer

BURST = 3000


def _burst_read_by_subscriber(srv: GatewayServer) -> tuple[int, int]:
    """Publish BURST QoS 0 messages on one topic; return (subscriber pulls, watch pulls)."""
    srv.call(srv.gateway.link.share_lmqs)
    made: list[Client] = []
    try:
        topic = f"ra/{uid()}"
        sub = Client(srv.port)
        made.append(sub)
        sub.connect()
        sub.subscribe(topic, qos=0)
        pub = Client(srv.port)
        made.append(pub)
        pub.connect()
        assert pub.publish(topic, b"first", qos=1) == 0
        assert sub.receive_one().payload == b"first"  # the watch runs from here on
        stats = srv.gateway.link.stats
        pulls0, watch0 = stats["pulls"], stats.get("readahead_pulls", 0)
        for i in range(BURST):
            pub.publish(topic, b"%d" % i, qos=0)
        assert pub.publish(topic, b"last", qos=1) == 0
        got = [m.payload for m in sub.receive(BURST + 1)]
        assert got == [b"%d" % i for i in range(BURST)] + [b"last"]
        assert srv.gateway.stats.dropped == 0
        return stats["pulls"] - pulls0, stats.get("readahead_pulls", 0) - watch0
    finally:
        for c in made:
            c.close()


def test_reader_on_a_foreign_written_lmq_takes_entries_the_watch_brought() -> None:
    with GatewayServer() as srv:
        own, watch = _burst_read_by_subscriber(srv)
        batch = srv.mqtt_config.pull_batch
    # Without the watch's entries the reader pulls every batch itself (BURST / batch
    # pulls at least); with them it pulls only where the read-ahead left a hole (5-11
    # holes measured on a loaded machine, so a quarter of the no-watch count is the bar).
    assert own < BURST // batch // 4, (own, watch)
    # The entries came with the watch's pulls: about one per batch, not one per message.
    assert BURST // batch <= watch < BURST // 2, (own, watch)


def test_no_readahead_still_delivers_everything(monkeypatch) -> None:
    # readahead_pulls = 0: the watch only long-polls the end (with a batch), readers pull.
    monkeypatch.setattr(lmq_watch, "READAHEAD_RECHECK_S", 0.01)
    with GatewayServer(readahead_pulls=0) as srv:
        _burst_read_by_subscriber(srv)


def test_readahead_window_is_bounded_by_the_recent_entries() -> None:
    # Read-ahead past what the recent entries hold would be evicted before it is read.
    from gateway.mqtt.lmq_state import RECENT_ENTRIES, LmqState, RecentBudget
    from gateway.mqtt.message import MqttMessage

    st = LmqState("b", "%LMQ%x", RecentBudget(1 << 40))
    assert lmq_watch._room(st, 0)
    assert not lmq_watch._room(st, RECENT_ENTRIES)  # by entries, whatever the sizes
    for i in range(8):
        st.remember(i, MqttMessage("t", b"x" * 64 * 1024, 0))
    held = st.recent_bytes
    assert lmq_watch._room(st, 1)
    assert not lmq_watch._room(st, 8 * held // (64 * 1024))  # by bytes, per LMQ
    # and by the gateway's max_recent_bytes when that is smaller
    small = LmqState("b", "%LMQ%y", RecentBudget(4 * 64 * 1024))
    for i in range(4):
        small.remember(i, MqttMessage("t", b"x" * 64 * 1024, 0))
    assert lmq_watch._room(small, 1)
    assert not lmq_watch._room(small, 2)
