"""The Apache C++ client (rocketmq wheel) with session credentials, as a child process.

    python cpp_acl_client.py --namesrv A --topic T --ak KEY --sk SECRET --count N
        [--consume-group G] [--consume-timeout S]

Sends N messages with a Producer, printing {"event": "sent"} or {"event": "error"} per
message; with --consume-group, then consumes with a PushConsumer until N messages came or
the timeout passed ({"event": "msg"} each). Ends with {"event": "done"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    fields["event"] = event
    with _lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--ak", required=True)
    ap.add_argument("--sk", required=True)
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--consume-group", default=None)
    ap.add_argument("--consume-timeout", type=float, default=60.0)
    args = ap.parse_args()

    producer = Producer("PG_CPP_ACL", timeout=3000)
    producer.set_namesrv_addr(args.namesrv)
    producer.set_session_credentials(args.ak, args.sk, "LMQ")
    producer.start()
    try:
        for i in range(args.count):
            msg = Message(args.topic)
            msg.set_body(f"acl-{i}")
            try:
                res = producer.send_sync(msg)
                emit("sent", i=i, status=int(res.status), offset=res.offset)
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                emit("error", i=i, error=repr(exc))
    finally:
        producer.shutdown()

    if args.consume_group:
        got = []
        done = threading.Event()

        def on_message(msg) -> None:
            got.append(msg.body)
            emit("msg", body=msg.body.decode("utf-8", "replace"))
            if len(got) >= args.count:
                done.set()

        consumer = PushConsumer(args.consume_group)
        consumer.set_namesrv_addr(args.namesrv)
        consumer.set_session_credentials(args.ak, args.sk, "LMQ")
        consumer.subscribe(args.topic, on_message, "*")
        consumer.start()
        deadline = time.monotonic() + args.consume_timeout
        while not done.is_set() and time.monotonic() < deadline:
            done.wait(0.2)
        consumer.shutdown()
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
