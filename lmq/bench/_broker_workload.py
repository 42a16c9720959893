"""The requests `lmq bench broker` sends: what a Java 4.x producer and pull consumer send.

Single sends are SEND_MESSAGE_V2 (310, one-letter header names, docs/protocol.md §5.1),
batches SEND_BATCH_MESSAGE (320, body of docs/protocol.md §7.7 built by `core.common.codec.encode_batch`),
pulls PULL_MESSAGE (11, docs/protocol.md §5.2) with the SUBSCRIPTION bit and `*`, as the C++ pull consumer
does (so no heartbeat is needed). Every message has its own UNIQ_KEY, as real producers
give them; the pools are cycled, so keys repeat only after `pool` requests.
"""

from __future__ import annotations

import os
import random
import time

from core.common.codec import BatchItem, encode_batch
from core.common.properties import encode_properties
from core.remoting.client import RemotingClient
from core.remoting.codec import RemotingCommand
from core.remoting.codes import RequestCode

__all__ = [
    "CONSUMER_GROUP",
    "PRODUCER_GROUP",
    "QUEUES",
    "TOPIC",
    "batch_commands",
    "create_topic",
    "queue_ranges",
    "pull_commands",
    "send_commands",
]

TOPIC = "BenchBroker"
QUEUES = 8
PRODUCER_GROUP = "PID_BENCH_BROKER"
CONSUMER_GROUP = "CID_BENCH_BROKER"
# PullSysFlag SUBSCRIPTION (docs/protocol.md §5.2): use the request's expression, no heartbeat needed.
_PULL_SYS_FLAG = "4"
_PREFIX = f"7F000001{os.getpid() & 0xFFFF:04X}"


def _uniq_key(i: int) -> str:
    # 32 hex digits like a Java MessageClientIDSetter id (ip, pid, then a counter).
    return f"{_PREFIX}{i & 0xFFFFFFFFFFFFFFFFFFFF:020X}"


def _body(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def send_ext(topic: str, queue_id: int, properties: str, *, batch: bool = False) -> dict:
    """Header of a 310/320 request, every value already a string (nothing to convert)."""
    return {
        "a": PRODUCER_GROUP,
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": properties,
        "j": "0",
        "k": "false",
        "l": "16",
        "m": "true" if batch else "false",
    }


def send_commands(count: int, body_size: int, topic: str = TOPIC) -> list[RemotingCommand]:
    """`count` single sends, spread round robin over the topic's queues."""
    bodies = [_body(body_size, seed) for seed in range(16)]
    out = []
    for i in range(count):
        props = encode_properties(
            {"TAGS": "TagA", "UNIQ_KEY": _uniq_key(i), "WAIT": "true"}
        )
        ext = send_ext(topic, i % QUEUES, props)
        out.append(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, bodies[i % 16]))
    return out


def batch_commands(
    count: int, batch_size: int, body_size: int, topic: str = TOPIC
) -> list[RemotingCommand]:
    """`count` batch sends of `batch_size` messages each, round robin over the queues."""
    bodies = [_body(body_size, seed) for seed in range(16)]
    out = []
    n = 0
    for i in range(count):
        items = []
        for _ in range(batch_size):
            props = encode_properties(
                {"TAGS": "TagB", "UNIQ_KEY": _uniq_key(1 << 40 | n), "WAIT": "true"}
            )
            items.append(BatchItem(0, bodies[n % 16], props))
            n += 1
        ext = send_ext(topic, i % QUEUES, encode_properties({"WAIT": "true"}), batch=True)
        out.append(
            RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, encode_batch(items))
        )
    return out


def pull_commands(
    ranges: dict[int, tuple[int, int]], per_pull: int, limit: int, topic: str = TOPIC
) -> list[RemotingCommand]:
    """Pulls of `per_pull` messages at full strides of each queue's [min, max) offsets,
    queues interleaved, at most `limit` in all. The newest messages are taken: retention
    (a full disk) moves min offsets up first."""
    per_queue = max(1, limit // max(1, len(ranges)))
    strides = {}
    for q, (low, high) in sorted(ranges.items()):
        first = max(low, high - per_queue * per_pull)
        strides[q] = list(range(first, high - per_pull + 1, per_pull))
    out: list[RemotingCommand] = []
    depth = 0
    while len(out) < limit and any(depth < len(s) for s in strides.values()):
        for q, starts in strides.items():
            if depth < len(starts) and len(out) < limit:
                ext = {
                    "consumerGroup": CONSUMER_GROUP,
                    "topic": topic,
                    "queueId": str(q),
                    "queueOffset": str(starts[depth]),
                    "maxMsgNums": str(per_pull),
                    "sysFlag": _PULL_SYS_FLAG,
                    "commitOffset": "0",
                    "suspendTimeoutMillis": "0",
                    "subscription": "*",
                    "subVersion": "0",
                    "expressionType": "TAG",
                }
                out.append(RemotingCommand.request(RequestCode.PULL_MESSAGE, ext))
        depth += 1
    return out


async def create_topic(client: RemotingClient, addr: str, topic: str = TOPIC) -> None:
    """UPDATE_AND_CREATE_TOPIC (docs/protocol.md §5.18) with QUEUES read and write queues."""
    ext = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(QUEUES),
        "writeQueueNums": str(QUEUES),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    resp = await client.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext))
    if resp.code != 0:
        raise RuntimeError(f"creating topic {topic} failed: code {resp.code} {resp.remark}")


async def queue_ranges(
    client: RemotingClient, addr: str, topic: str = TOPIC
) -> dict[int, tuple[int, int]]:
    """(GET_MIN_OFFSET, GET_MAX_OFFSET) (docs/protocol.md §5.8) of every queue of the topic."""
    out = {}
    for q in range(QUEUES):
        bounds = []
        for code in (RequestCode.GET_MIN_OFFSET, RequestCode.GET_MAX_OFFSET):
            cmd = RemotingCommand.request(code, {"topic": topic, "queueId": str(q)})
            resp = await client.invoke(addr, cmd)
            if resp.code != 0:
                raise RuntimeError(f"offset query {code} {topic}/{q} failed: "
                                   f"{resp.code} {resp.remark}")
            bounds.append(int(resp.ext_str("offset", "0") or 0))
        out[q] = (bounds[0], bounds[1])
    return out
