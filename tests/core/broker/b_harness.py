"""Helpers of the broker-services tests (schedule, retry/DLQ, transactions, locks).

Servers and raw requests come from the broker-core harness (`harness.py`); this adds the
C++ driver scripts of `b_drivers/` and a few protocol shortcuts used by several tests.
"""

from __future__ import annotations

from pathlib import Path

from core.common.codec import decode_records
from core.common.message import MessageExt
from core.remoting.codec import RemotingCommand
from tests.core.broker.harness import (
    Driver,
    pull_request,
    route_of,
    run_driver,
    sync_invoke,
    wait_until,
)
from tests.core.client.cluster import wait_for

B_DRIVERS = Path(__file__).resolve().parent / "b_drivers"

# 18 one-second levels: retries (level 3 + reconsumeTimes) come back after 1 s.
FAST_LEVELS = " ".join(["1s"] * 18)


def toml_config(**values) -> str:
    """A TOML snippet of broker settings (strings quoted, numbers as they are)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- C++ drivers
def b_driver(script: str, *args: str) -> Driver:
    """Start one of our driver scripts (JSON lines collected by the harness Driver)."""
    return Driver(str(B_DRIVERS / script), *args)


def b_run(script: str, *args: str, timeout: float = 120.0) -> list[dict]:
    return run_driver(str(B_DRIVERS / script), *args, timeout=timeout)


def cpp_produce(namesrv: str, topic: str, count: int = 1, *, delay: int = 0,
                prefix: str = "msg", group: str = "PID_B") -> list[dict]:
    """Send with the C++ producer; returns its "sent" events (asserts none failed)."""
    args = ["--namesrv", namesrv, "--group", group, "--topic", topic,
            "--count", str(count), "--prefix", prefix]
    if delay:
        args += ["--delay", str(delay)]
    events = b_run("producer.py", *args)
    errors = [e for e in events if e["event"] == "error"]
    assert not errors, errors
    sent = [e for e in events if e["event"] == "sent"]
    assert len(sent) == count, events
    return sent


def cpp_pull_all(namesrv: str, topic: str, group: str = "CID_B_CHECK") -> list[dict]:
    """Every message of `topic` as the C++ pull consumer reads it."""
    events = b_run("pull_all.py", "--namesrv", namesrv, "--group", group, "--topic", topic)
    assert events and events[-1]["event"] == "done", events[-3:]
    return [e for e in events if e["event"] == "msg"]


def events_of(driver: Driver, kind: str = "msg") -> list[dict]:
    return driver.of(kind)


# ---------------------------------------------------------------------- raw protocol
def request(code: int, body: bytes | None = None, **ext) -> RemotingCommand:
    """A request with every ext value as a string (Java style)."""
    return RemotingCommand.request(code, {k: str(v) for k, v in ext.items()}, body)


def create_topic(addr: str, topic: str, queues: int = 4) -> None:
    """UPDATE_AND_CREATE_TOPIC before a consumer starts: a consumer that finds no route
    asks again only every 30 s (docs/protocol.md §8), which would make the tests slow, not different."""
    resp = sync_invoke(addr, request(
        17, topic=topic, defaultTopic="TBW102", readQueueNums=queues, writeQueueNums=queues,
        perm=6, topicFilterType="SINGLE_TAG"))
    assert resp.code == 0, resp.remark


def prepare_consumer_topics(server, topic: str, group: str, queues: int = 4) -> None:
    """Create `topic` and `%RETRY%<group>`, and wait until the name server routes them."""
    create_topic(server.broker_addr, topic, queues)
    create_topic(server.broker_addr, f"%RETRY%{group}", 1)
    for name in (topic, f"%RETRY%{group}"):
        wait_until(lambda n=name: route_of(server.namesrv_addr, n), 10, what=f"route of {name}")


def messages_sync(addr: str, topic: str, queue_id: int = 0) -> list[MessageExt]:
    """Every message of one queue, pulled over a blocking socket."""
    out: list[MessageExt] = []
    offset = 0
    while True:
        resp = sync_invoke(addr, pull_request("CID_B_RAW", topic, queue_id, offset))
        if resp.code != 0:
            return out
        out += decode_records(resp.body_bytes())
        offset = int(resp.ext_fields["nextBeginOffset"])


async def messages(client, addr: str, topic: str, queue_id: int = 0) -> list[MessageExt]:
    """Every message of one queue, pulled with a RemotingClient."""
    out: list[MessageExt] = []
    offset = 0
    while True:
        resp = await client.invoke(addr, pull_request("CID_B_RAW", topic, queue_id, offset))
        if resp.code != 0:
            return out
        out += decode_records(resp.body_bytes())
        offset = int(resp.ext_fields["nextBeginOffset"])


async def wait_async(predicate, timeout: float, what: str = "condition", interval: float = 0.05):
    """Poll the (sync or async) `predicate` until it returns a true value (wait_for, with
    what is awaited third)."""
    return await wait_for(predicate, timeout, interval, what)
