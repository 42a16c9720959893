"""Real-process HA set-ups shared by the HA process tests (docs/ha.md): `lmq namesrv
--controller` with brokers of one broker name (`Cluster`, `started`), topic creation and
reads by plain remoting requests, and the POP steps of the POP failover tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio

from core.client.pop_consumer import PopClient
from core.common.codec import decode_records
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    REPO,
    ServerProcess,
    create_topic,
    free_port,
    has_topic,
    pull_request,
    send_request,
    sync_invoke,
    wait_until,
)

TOPIC = "FailoverT"
QUEUES = 4
CONFIG = ('ha_secret = "failover-process-secret"\nbroker_role = "SYNC_MASTER"\n'
          "ha_config_sync_s = 1.0\n")
GET_STATE = 900103


class Cluster:
    """A controller-mode name server and the brokers of broker name "bk" started so far."""

    def __init__(self, tmp_path, config: str = CONFIG):
        self.tmp = tmp_path
        self.config = config
        port = free_port()
        self.ns_addr = f"127.0.0.1:{port}"
        log = open(tmp_path / "namesrv.log", "ab")
        self.ns = subprocess.Popen(
            [sys.executable, "-m", "lmq", "namesrv", "--port", str(port), "--controller",
             "--controller-dir", str(tmp_path / "ctl")],
            cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._ns_up, 30, what="name server")
        self.brokers: dict[int, ServerProcess] = {}

    def _ns_up(self) -> bool:
        try:
            return sync_invoke(self.ns_addr, RemotingCommand.request(GET_STATE, {})).code == 0
        except OSError:
            return False

    def broker(self, bid: int) -> ServerProcess:
        b = self.brokers.get(bid)
        if b is None:
            b = self.brokers[bid] = ServerProcess(
                self.tmp / f"b{bid}", namesrv_addr=self.ns_addr, broker_name="bk",
                config_text=self.config,
                extra_args=("--broker-id", str(bid), "--controller-addr", self.ns_addr,
                            "--ha-port", str(free_port())))
        return b.start()

    def state(self) -> dict:
        resp = sync_invoke(self.ns_addr, RemotingCommand.request(GET_STATE, {}))
        return json.loads(resp.body_bytes()).get("bk", {})

    def master(self) -> ServerProcess | None:
        st = self.state()
        lease = st.get("leaseLeftS", 0) > 0
        return self.brokers.get(st.get("masterId")) if lease else None

    def master_and_slave(self) -> tuple[ServerProcess, ServerProcess]:
        """The master of a started pair and the other broker."""
        master = self.master()
        return master, next(b for b in self.brokers.values() if b is not master)

    def in_sync(self, n: int) -> bool:
        return len(self.state().get("syncStateSet", [])) >= n

    def start_pair(self) -> None:
        """Broker 1, then (once it is master) the other one, until both are in sync."""
        self.broker(1)
        wait_until(lambda: self.master() is not None, 20, what="a master")
        self.broker(2 if self.state()["masterId"] == 1 else 1)
        wait_until(lambda: self.in_sync(2), 30, what="in-sync slave")

    def close(self) -> None:
        os.kill(self.ns.pid, signal.SIGCONT)
        for b in self.brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                os.kill(b.proc.pid, signal.SIGCONT)
            b.kill()
        self.ns.kill()
        self.ns.wait(10)


def pull_queue(addr: str, qid: int, topic: str = TOPIC) -> list[bytes]:
    """Every body in one queue, from offset 0 (consumer group "G")."""
    out, offset = [], 0
    while True:
        resp = sync_invoke(addr, pull_request("G", topic, qid, offset))
        if resp.code != 0:
            return out
        out += [m.body for m in decode_records(resp.body_bytes())]
        offset = int(resp.ext_fields["nextBeginOffset"])


def started(tmp_path, config: str = CONFIG) -> Cluster:
    """A master and an in-sync slave, with TOPIC on both."""
    c = Cluster(tmp_path, config)
    c.start_pair()
    master, slave = c.master_and_slave()
    create_topic(master.broker_addr, TOPIC, QUEUES)
    wait_until(lambda: has_topic(slave.broker_addr, TOPIC), 30, what="topic on the slave")
    return c


async def send_and_pop(client: RemotingClient, addr: str, group: str, n: int,
                       popped: int) -> tuple[PopClient, list]:
    """Sends bodies m00.. m{n-1} to queue 0 of TOPIC, then pops `popped` of them (invisible
    for ten minutes): the POP client and the messages popped."""
    for i in range(n):
        r = await client.invoke(addr, send_request(TOPIC, b"m%02d" % i, queue_id=0))
        assert r.code == 0, r.remark
    pc = PopClient(client, addr, "bk", group)
    got: list = []
    while len(got) < popped:
        res = await pc.pop(TOPIC, queue_id=0, max_nums=popped - len(got), invisible_ms=600_000)
        got += res.messages
    return pc, got


def pop_the_rest(addr: str, group: str, expected: int) -> list[bytes]:
    """Pops queue 0 of TOPIC until `expected` bodies came (8 s at most), then a little longer
    (nothing else may come): the bodies popped."""

    async def pop_all() -> list[bytes]:
        async with RemotingClient(request_timeout=10.0) as client:
            pc = PopClient(client, addr, "bk", group)
            bodies: list[bytes] = []
            with trio.move_on_after(8):
                while len(bodies) < expected:
                    res = await pc.pop(TOPIC, queue_id=0, max_nums=32, invisible_ms=60_000)
                    bodies += [m.body for m in res.messages]
                    if not res.messages:
                        await trio.sleep(0.2)
            with trio.move_on_after(1.5):
                while True:
                    res = await pc.pop(TOPIC, queue_id=0, max_nums=32, invisible_ms=60_000)
                    bodies += [m.body for m in res.messages]
                    await trio.sleep(0.2)
            return bodies

    return trio.run(pop_all)
