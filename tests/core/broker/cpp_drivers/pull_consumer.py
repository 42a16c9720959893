"""Read every queue of a topic once with the C++ PullConsumer.

    python pull_consumer.py --namesrv A --group G --topic T [--expression '*']

Prints {"event": "msg", ...} per message and {"event": "done", "count": n}.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_parser, describe, emit  # noqa: E402
from rocketmq.client import PullConsumer  # noqa: E402


def main() -> int:
    ap = client_parser()
    ap.add_argument("--expression", default="*")
    args = ap.parse_args()

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    count = 0
    try:
        for msg in consumer.pull(args.topic, args.expression):
            count += 1
            emit("msg", **describe(msg))
    finally:
        consumer.shutdown()
    emit("done", count=count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
