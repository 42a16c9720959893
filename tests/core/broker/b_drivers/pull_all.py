"""Read every message of a topic from offset 0 with the C++ pull consumer.

    python pull_all.py --namesrv 127.0.0.1:9876 --group G --topic T

Prints {"event": "msg", ...} per message, then {"event": "done", "count": n}.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from b_common import client_parser, describe, pull_every_queue  # noqa: E402


def main() -> int:
    return pull_every_queue(client_parser().parse_args(), describe)


if __name__ == "__main__":
    sys.exit(main())
