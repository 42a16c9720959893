"""Load of `lmq bench grpc` with the official 5.x client; run by the venv's python:

    python _rmq5_load.py '{"endpoint": ..., "op": "send"|"receive", ...}'

send: `messages` bodies of `size` bytes with `inflight` send_async futures outstanding.
receive: SimpleConsumer receive (batch 32) + ack of every message until `messages` came.
Prints one JSON line: {"messages": n, "seconds": s}.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _config(args):
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(args["endpoint"], Credentials(), request_timeout=10)


def send(args) -> dict:
    from rocketmq import Message, Producer

    producer = Producer(_config(args), (args["topic"],))
    producer.startup()
    body = b"x" * args["size"]
    futures, done = [], 0
    start = time.perf_counter()
    for _ in range(args["messages"]):
        m = Message()
        m.topic = args["topic"]
        m.body = body
        futures.append(producer.send_async(m))
        if len(futures) >= args["inflight"]:
            futures.pop(0).result()
            done += 1
    for f in futures:
        f.result()
        done += 1
    seconds = time.perf_counter() - start
    producer.shutdown()
    return {"messages": done, "seconds": seconds}


def receive(args) -> dict:
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(_config(args), args["group"],
                              {args["topic"]: FilterExpression("*")}, await_duration=2)
    consumer.startup()
    if args.get("prime"):
        consumer.receive(32, 30)  # creates the group's read position, then exit
        consumer.shutdown()
        return {"messages": 0, "seconds": 0.0}
    got = 0
    start = time.perf_counter()
    deadline = time.time() + args.get("deadline_s", 120)
    while got < args["messages"] and time.time() < deadline:
        for m in consumer.receive(32, 30):
            consumer.ack(m)
            got += 1
    seconds = time.perf_counter() - start
    consumer.shutdown()
    return {"messages": got, "seconds": seconds}


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    print(json.dumps({"send": send, "receive": receive}[a["op"]](a)), flush=True)
    os._exit(0)  # the client leaves non-daemon threads behind
