"""Send messages with the C++ producer.

    python producer.py --namesrv 127.0.0.1:9876 --group PID --topic T --count 3
        [--mode sync|oneway|orderly|batch] [--tag TagA] [--body-size N] [--batch-size N]
        [--prefix msg] [--keys]

Prints {"event": "sent", "i", "body", "msg_id", "offset", "status"} per send (oneway:
no result fields), {"event": "error", "i", "error"} per failed send, then {"event": "done"}.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_parser, emit  # noqa: E402
from rocketmq.client import Message, Producer  # noqa: E402


def body_of(prefix: str, i: int, size: int) -> str:
    base = f"{prefix}-{i}"
    if size > len(base):
        # Incompressible-ish filler would not test compression; repeat text instead.
        base = (base + "|" + "x" * size)[:size]
    return base


def make(topic: str, args, i: int) -> Message:
    msg = Message(topic)
    msg.set_body(body_of(args.prefix, i, args.body_size))
    if args.tag:
        msg.set_tags(args.tag)
    if args.keys:
        msg.set_keys(f"key-{args.prefix}-{i}")
    return msg


def main() -> int:
    ap = client_parser("PID_LMQ_TEST")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--mode", default="sync", choices=("sync", "oneway", "orderly", "batch"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--keys", action="store_true")
    ap.add_argument("--body-size", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--prefix", default="msg")
    ap.add_argument("--timeout-ms", type=int, default=3000)
    ap.add_argument("--interval-ms", type=int, default=0, help="pause between sends")
    args = ap.parse_args()

    producer = Producer(args.group, timeout=args.timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    failures = 0
    try:
        if args.mode == "batch":
            for start in range(0, args.count, args.batch_size):
                idx = list(range(start, min(args.count, start + args.batch_size)))
                try:
                    res = producer.send_batch([make(args.topic, args, i) for i in idx])
                    emit("sent", i=idx, body=[body_of(args.prefix, i, args.body_size) for i in idx],
                         msg_id=res.msg_id, offset=res.offset, status=int(res.status))
                except Exception as exc:  # noqa: BLE001 - report every failure
                    failures += 1
                    emit("error", i=idx, error=repr(exc))
        else:
            for i in range(args.count):
                if args.interval_ms and i:
                    time.sleep(args.interval_ms / 1000)
                msg = make(args.topic, args, i)
                try:
                    if args.mode == "sync":
                        res = producer.send_sync(msg)
                    elif args.mode == "orderly":
                        res = producer.send_orderly(msg, i)
                    else:
                        producer.send_oneway(msg)
                        emit("sent", i=i, body=body_of(args.prefix, i, args.body_size))
                        continue
                    emit("sent", i=i, body=body_of(args.prefix, i, args.body_size),
                         msg_id=res.msg_id, offset=res.offset, status=int(res.status))
                except Exception as exc:  # noqa: BLE001
                    failures += 1
                    emit("error", i=i, error=repr(exc))
    finally:
        producer.shutdown()
    emit("done", failures=failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
