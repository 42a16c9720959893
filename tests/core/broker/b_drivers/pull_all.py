"""Read every message of a topic from offset 0 with the C++ pull consumer.

    python pull_all.py --namesrv 127.0.0.1:9876 --group G --topic T

Prints {"event": "msg", ...} per message, then {"event": "done", "count": n}.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from b_common import client_parser, describe, emit  # noqa: E402
from rocketmq.client import PullConsumer  # noqa: E402


def main() -> int:
    ap = client_parser()
    args = ap.parse_args()

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.start()
    count = 0
    try:
        for msg in consumer.pull(args.topic):
            emit("msg", **describe(msg))
            count += 1
    finally:
        consumer.shutdown()
    emit("done", count=count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
