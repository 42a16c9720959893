"""Consume with the C++ push consumer, failing chosen deliveries.

    python push_consumer.py --namesrv 127.0.0.1:9876 --group G --topic T \
        [--orderly] [--fail-first N] [--fail-always] [--expect N] [--max-seconds S]

Every callback prints {"event": "msg", ...message fields...}. With --fail-first N the
first N deliveries of each body return ConsumeStatus RECONSUME_LATER; --fail-always
returns it every time. The wheel's `subscribe()` can only signal RECONSUME_LATER by an
exception escaping a ctypes callback, so the driver registers a callback that returns the
status code itself, through the same C functions `subscribe()` uses. The process shuts the consumer down
and prints {"event": "done"} once N deliveries were acknowledged (--expect), when stdin
is closed, or after --max-seconds.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from b_common import client_parser, describe, emit, stop_on_stdin_close  # noqa: E402
from rocketmq.client import PushConsumer, RecvMessage  # noqa: E402
from rocketmq.exceptions import ffi_check  # noqa: E402
from rocketmq.ffi import _CConsumeStatus, dll  # noqa: E402

CONSUME_SUCCESS = int(_CConsumeStatus.CONSUME_SUCCESS.value)
RECONSUME_LATER = int(_CConsumeStatus.RECONSUME_LATER.value)


def main() -> int:
    ap = client_parser()
    ap.add_argument("--orderly", action="store_true")
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--fail-always", action="store_true")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    args = ap.parse_args()

    seen: collections.Counter[str] = collections.Counter()
    acked = 0
    lock = threading.Lock()
    finished = threading.Event()

    def callback(_consumer, handle) -> int:
        nonlocal acked
        info = describe(RecvMessage(handle))
        with lock:
            seen[info["body"]] += 1
            fail = args.fail_always or seen[info["body"]] <= args.fail_first
            info["attempt"] = seen[info["body"]]
            info["thread"] = threading.get_ident()
            info["result"] = "later" if fail else "ok"
            emit("msg", **info)
            if not fail:
                acked += 1
                if args.expect and acked >= args.expect:
                    finished.set()
        return RECONSUME_LATER if fail else CONSUME_SUCCESS

    consumer = PushConsumer(args.group, orderly=args.orderly)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_thread_count(1)
    consumer.set_message_batch_max_size(1)
    ffi_check(dll.Subscribe(consumer._handle, args.topic.encode(), b"*"))
    consumer._register_callback(callback)
    consumer.start()
    stop_on_stdin_close(finished)
    emit("started", pid=os.getpid())
    deadline = time.monotonic() + args.max_seconds
    while not finished.is_set() and time.monotonic() < deadline:
        finished.wait(0.1)
    # Let the last offsets/acks reach the broker before shutting down.
    time.sleep(0.5)
    consumer.shutdown()
    emit("done", acked=acked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
