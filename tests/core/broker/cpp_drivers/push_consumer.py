"""Consume with the C++ PushConsumer until stdin is closed (or a line is written).

    python push_consumer.py --namesrv A --group G --topic T [--expression '*']
        [--orderly] [--broadcast] [--instance NAME]

Prints {"event": "started"}, then {"event": "msg", ...describe(msg)} per delivery, and
{"event": "done"} after shutdown.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_parser, describe, emit, wait_for_stdin_close  # noqa: E402
from rocketmq.client import MessageModel, PushConsumer  # noqa: E402


def main() -> int:
    ap = client_parser()
    ap.add_argument("--expression", default="*")
    ap.add_argument("--orderly", action="store_true")
    ap.add_argument("--broadcast", action="store_true")
    ap.add_argument("--instance", default=None)
    args = ap.parse_args()

    model = MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING
    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    if args.instance:
        consumer.set_instance_name(args.instance)

    def on_message(msg) -> None:
        emit("msg", **describe(msg))

    consumer.subscribe(args.topic, on_message, args.expression)
    consumer.start()
    emit("started", pid=os.getpid())
    wait_for_stdin_close()
    consumer.shutdown()
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
