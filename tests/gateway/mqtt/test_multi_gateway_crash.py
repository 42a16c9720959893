"""A session's in-flight state survives its gateway's kill -9 (issue 12): while connected,
its in-flight packet ids and inbound QoS 2 ids are written into its cluster record as they
change, so the gateway that resumes it re-sends the unacknowledged messages with DUP and
their packet ids, and knows the QoS 2 ids. Real processes: a name server, a broker in
`apache_strict` mode, two `lmq mqtt` gateways, paho and raw clients."""

from __future__ import annotations

import time

import pytest

from gateway.mqtt.packets import Properties, Pubcomp, Publish, Pubrec, Pubrel
from tests.gateway.mqtt.cluster_support import (
    Cluster,
    clients,
    connected,
    new_client,
    publish_unacked,
    resumed_with_dups,
)
from tests.gateway.mqtt.e2e_support import RawClient, uid

__all__ = ["clients"]  # fixtures used below

pytestmark = pytest.mark.slow


def test_inflight_and_inbound_qos2_ids_move_to_the_other_gateway_after_kill9(
        tmp_path_factory: pytest.TempPathFactory, clients) -> None:
    c = Cluster(tmp_path_factory.mktemp("cluster"), brokers=1).start()
    raws: list[RawClient] = []
    try:
        a = c.gateway({"state_flush_interval_s": 0.1})
        b = c.gateway({"state_flush_interval_s": 0.1})
        topic, q2_topic = f"crash/{uid()}", f"crash-q2/{uid()}"
        cid, q2_cid = "cr-" + uid(), "cq-" + uid()
        # QoS 1 receiver on A that never acknowledges.
        x = new_client(clients, a.port, client_id=cid, version=4)
        x.connect(clean_start=False)
        x.paho.manual_ack_set(True)
        x.subscribe(topic, qos=1)
        # QoS 2 sender on A whose PUBREL never comes before the crash.
        sub = connected(clients, b.port)
        sub.subscribe(q2_topic, qos=2)
        keep = Properties(session_expiry_interval=300)
        first = RawClient(a.port)
        raws.append(first)
        assert first.connect(q2_cid, clean_start=False, properties=keep).reason_code == 0
        first.send(Publish(q2_topic, b"once", qos=2, packet_id=7))
        assert first.expect(Pubrec).packet_id == 7
        pub = connected(clients, b.port)
        held = publish_unacked(pub, x, topic)
        assert [m.payload for m in sub.receive(1)] == [b"once"]
        time.sleep(1.0)  # A's state flush (0.1 s) and its record write reached the cluster
        a.kill9()
        # The QoS 1 session on B: exactly the unacknowledged ones again, DUP, same ids.
        y = resumed_with_dups(clients, b.port, cid, held)
        assert pub.publish(topic, b"after", qos=1) == 0
        after = y.receive_one()
        assert (after.payload, after.dup) == (b"after", False)
        # The QoS 2 session on B knows packet id 7: not stored twice, PUBREL completes.
        second = RawClient(b.port)
        raws.append(second)
        assert second.connect(q2_cid, clean_start=False, properties=keep).session_present
        second.send(Publish(q2_topic, b"once", qos=2, packet_id=7, dup=True))
        assert second.expect(Pubrec).packet_id == 7
        second.send(Pubrel(7))
        done = second.expect(Pubcomp)
        assert (done.packet_id, done.reason_code) == (7, 0)
        sub.nothing()
    finally:
        for r in raws:
            r.close()
        c.stop()
