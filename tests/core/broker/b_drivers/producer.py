"""Send messages with the C++ producer.

    python producer.py --namesrv 127.0.0.1:9876 --group PID --topic T --count 3 \
        [--delay LEVEL] [--tag TagA] [--prefix msg] [--property NAME=VALUE ...]

Prints {"event": "sent", "i", "body", "msg_id", "offset", "status"} per message, then
{"event": "done"}; a send failure prints {"event": "error", ...} and exits 1.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from b_common import client_parser, emit  # noqa: E402
from rocketmq.client import Message, Producer  # noqa: E402


def main() -> int:
    ap = client_parser()
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--delay", type=int, default=0)
    ap.add_argument("--tag", default="TagA")
    ap.add_argument("--prefix", default="msg")
    ap.add_argument("--property", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()

    producer = Producer(args.group)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    try:
        for i in range(args.count):
            body = f"{args.prefix}-{i}"
            msg = Message(args.topic)
            msg.set_keys(f"key-{i}")
            msg.set_tags(args.tag)
            msg.set_body(body)
            if args.delay:
                msg.set_delay_time_level(args.delay)
            for prop in args.property:
                msg.set_property(*prop.split("=", 1))
            try:
                result = producer.send_sync(msg)
            except Exception as exc:  # report and stop: the test decides
                emit("error", i=i, error=repr(exc))
                return 1
            emit("sent", i=i, body=body, msg_id=result.msg_id, offset=result.offset,
                 status=int(result.status))
        emit("done")
        return 0
    finally:
        producer.shutdown()


if __name__ == "__main__":
    sys.exit(main())
