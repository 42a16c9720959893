"""Gaps a newcomer's walk through the docs found (issue 15 checklist): each a real `lmq`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.gateway.mqtt.e2e_support import free_port

REPO = Path(__file__).resolve().parents[2]


def test_consumer_reset_takes_a_negative_relative_time():
    """docs/client.md: `lmq admin consumer reset CG_ORDERS Orders --time -1h` (argparse used
    to read -1h as an unknown option): parsed, so the only error is the dead name server."""
    r = subprocess.run([sys.executable, "-m", "lmq", "admin", "consumer", "reset", "CG_ORDERS",
                        "Orders", "--time", "-1h", "-n", f"127.0.0.1:{free_port()}",
                        "--timeout", "2"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no name server reachable" in lines[0], r.stderr
    assert "usage:" not in r.stderr and "Traceback" not in r.stderr
