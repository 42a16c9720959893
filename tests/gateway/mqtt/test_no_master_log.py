"""`lmq mqtt` with a name server but no broker: "no master broker" is logged once per
interval with a count, not on every 0.2 s cluster poll."""

from __future__ import annotations

import logging

import trio
import trio.testing

from core.client import ClientInstance
from core.namesrv.config import NamesrvConfig
from core.namesrv.server import NameServer
from gateway.mqtt import broker_link
from gateway.mqtt.broker_link import BrokerLink
from gateway.mqtt.config import MqttConfig

MESSAGE = "lists no master broker"


def _records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == broker_link.__name__ and MESSAGE in r.getMessage()]


def test_burst_of_no_master_logs_once_then_with_count(caplog):
    caplog.set_level(logging.INFO, logger=broker_link.__name__)
    clock = trio.testing.MockClock()  # rate 0: time moves only when the test jumps it

    async def main():
        nameserver = NameServer(NamesrvConfig(host="127.0.0.1", port=0))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(nameserver.serve)
            async with ClientInstance(namesrv_addr=f"127.0.0.1:{port}") as client:
                link = BrokerLink(client, MqttConfig(), router=lambda topic: ())
                for _ in range(25):  # a burst of polls from a real name server
                    await link.refresh_cluster()
                assert len(_records(caplog)) == 1
                clock.jump(broker_link.NO_MASTER_LOG_INTERVAL_S / 2)
                await link.refresh_cluster()
                assert len(_records(caplog)) == 1
                clock.jump(broker_link.NO_MASTER_LOG_INTERVAL_S)
                await link.refresh_cluster()
                records = _records(caplog)
                assert len(records) == 2
                assert "25 more times" in records[1].getMessage()
                assert records[0].levelno == logging.WARNING
                assert link.brokers == {} and link.queues == []
            nameserver.close()

    trio.run(main, clock=clock)
