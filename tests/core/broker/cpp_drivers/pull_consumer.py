"""Read every queue of a topic once with the C++ PullConsumer.

    python pull_consumer.py --namesrv A --group G --topic T [--expression '*']

Prints {"event": "msg", ...} per message and {"event": "done", "count": n}.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_parser, describe, pull_every_queue  # noqa: E402


def main() -> int:
    ap = client_parser()
    ap.add_argument("--expression", default="*")
    args = ap.parse_args()
    return pull_every_queue(args, describe, args.expression)


if __name__ == "__main__":
    sys.exit(main())
