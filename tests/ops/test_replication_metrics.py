"""Replication lag in /metrics: a SYNC_MASTER and its slave, real `lmq` processes."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.core.broker.harness import (
    ServerProcess,
    create_topic,
    free_port,
    send_request,
    sync_invoke,
    wait_until,
)
from tests.ops.test_metrics import samples

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
SECRET_TOML = 'ha_secret = "metrics-test-secret"\n'


def _scrape(proc: ServerProcess) -> dict[str, float]:
    port = re.search(r"metrics on http://[\d.]+:(\d+)/", proc.log_path.read_text()).group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return samples(resp.read().decode())


def test_replication_lag_and_peers(tmp_path):
    ha_port = free_port()
    master = ServerProcess(
        tmp_path / "m", broker_name="bk", extra_args=("--metrics-port", "0"),
        config_text=SECRET_TOML + f'broker_role = "SYNC_MASTER"\nha_listen_port = {ha_port}\n',
    ).start()
    slave = None
    try:
        before = _scrape(master)
        assert before["lmq_broker_replication_peers"] == 0
        assert not any(k.startswith("lmq_broker_replication_lag_bytes{") for k in before)
        topic = "HaMetrics"
        create_topic(master.broker_addr, topic, 1)
        slave = ServerProcess(
            tmp_path / "s", namesrv_addr=master.namesrv_addr, broker_name="bk",
            config_text=SECRET_TOML,
            extra_args=("--broker-role", "SLAVE", "--broker-id", "1",
                        "--ha-master-address", f"127.0.0.1:{ha_port}", "--metrics-port", "0"),
        ).start()
        # SYNC_MASTER: a send is acknowledged once the slave holds it.
        wait_until(lambda: sync_invoke(master.broker_addr, send_request(topic, b"x")).code == 0,
                   30, what="slave connected")
        for i in range(20):
            assert sync_invoke(master.broker_addr, send_request(topic, b"m%d" % i)).code == 0
        m = _scrape(master)
        assert m["lmq_broker_replication_peers"] == 1
        assert m['lmq_broker_replication_lag_bytes{peer=slave 1}'] == 0
        # the Grafana dashboard's replication panel queries series that exist
        dashboard = (REPO / "docs" / "grafana" / "lmq-gateway.json").read_text()
        names = set(re.findall(r"\b(lmq_broker_replication_[a-z_]+)\{", dashboard))
        assert names and all(any(k.startswith(n + "{") for k in m) for n in names), names
        wait_until(lambda: _scrape(slave).get("lmq_broker_replication_lag_bytes{peer=master}")
                   == 0, 30, what="the slave's lag at 0")
        assert _scrape(slave)["lmq_broker_replication_peers"] == 1
        slave.kill()
        wait_until(lambda: _scrape(master)["lmq_broker_replication_peers"] == 0, 30,
                   what="the slave's disconnect")
    finally:
        master.kill()
        if slave is not None:
            slave.kill()
