"""Replication between real `lmq` processes: a SYNC_MASTER killed -9 loses nothing it
acknowledged, because the slave already holds it (docs/ha.md)."""

from __future__ import annotations

import pytest

from tests.core.broker.harness import (
    ServerProcess,
    create_topic,
    free_port,
    has_topic,
    send_request,
    sync_invoke,
    wait_until,
)
from tests.core.ha.process_cluster import pull_queue

pytestmark = pytest.mark.slow

SECRET_TOML = 'ha_secret = "process-test-secret"\n'


def test_sync_master_killed_slave_holds_every_acknowledged_message(tmp_path):
    ha_port = free_port()
    master = ServerProcess(
        tmp_path / "m", broker_name="bk",
        config_text=SECRET_TOML + f'broker_role = "SYNC_MASTER"\nha_listen_port = {ha_port}\n',
    ).start()
    slave = None
    try:
        topic = "HaProc"
        create_topic(master.broker_addr, topic, 2)
        slave = ServerProcess(
            tmp_path / "s", namesrv_addr=master.namesrv_addr, broker_name="bk",
            config_text=SECRET_TOML + "ha_config_sync_s = 0.5\n",
            extra_args=("--broker-role", "SLAVE", "--broker-id", "1",
                        "--ha-master-address", f"127.0.0.1:{ha_port}"),
        ).start()
        wait_until(lambda: has_topic(slave.broker_addr, topic), 20, what="topic synced")
        # The slave is connected once a send to the master is fully acknowledged.
        wait_until(lambda: sync_invoke(master.broker_addr, send_request(topic, b"probe")).code == 0,
                   20, what="slave connected")
        acked = [b"probe"]
        for i in range(200):
            body = b"msg-%d" % i
            resp = sync_invoke(master.broker_addr, send_request(topic, body, queue_id=i % 2))
            if resp.code == 0:
                acked.append(body)
        assert len(acked) > 100
        master.kill()
        held = pull_queue(slave.broker_addr, 0, topic) + pull_queue(slave.broker_addr, 1, topic)
        assert set(acked) <= set(held)
        assert len(held) == len(set(held))
        # A slave refuses writes (RocketMQ: SERVICE_NOT_AVAILABLE from a slave store).
        assert sync_invoke(slave.broker_addr, send_request(topic, b"no")).code == 14
    finally:
        master.kill()
        if slave is not None:
            slave.kill()
