"""`lmq_pop_unconfirmed_acks_total`: POP acks a SYNC_MASTER applied without its slave's
confirmation (core/client/pop_consumer.py UNCONFIRMED), scraped from a real metrics
endpoint while a real POP client acks against a master whose slave stopped."""

from __future__ import annotations

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from lmq.metrics import Exporter
from tests.core.ha.test_pop_unconfirmed import _popped, unconfirmed  # noqa: F401 (fixture)
from tests.core.ha.test_replication import cluster, wait_for
from tests.ops.test_endpoint import _request

pytestmark = pytest.mark.timeout(60)
NAME = "lmq_pop_unconfirmed_acks_total"


async def _scrape(port: int) -> dict[str, float]:
    answer = await _request(port, b"GET /metrics HTTP/1.0\r\n\r\n")
    text = answer.split(b"\r\n\r\n", 1)[1].decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_unconfirmed_pop_acks_are_exported(tmp_path, unconfirmed):  # noqa: F811
    async def main():
        async with cluster(tmp_path) as (client, master, slave, _ns, nursery):
            exporter = Exporter("127.0.0.1", 0, broker=master)
            await nursery.start(exporter.serve)
            await wait_for(lambda: master.ha_master.slaves)
            pc, got = await _popped(client, master, 3)
            assert await pc.ack(got[0])  # confirmed by the slave: not counted
            assert (await _scrape(exporter.port))[NAME] == 0
            slave.stop()
            await wait_for(lambda: not master.ha_master.slaves)
            assert await pc.ack(got[1])
            assert await pc.nack(got[2])
            assert (await _scrape(exporter.port))[NAME] == 2
            exporter.stop()

    trio.run(main)
