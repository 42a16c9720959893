"""`lmq bench grpc --quick` runs end to end and reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # starts lmq serve, an echo server and the official client five times
def test_bench_grpc_quick(rmq5_python):
    out = subprocess.run([sys.executable, "-m", "lmq", "bench", "grpc", "--quick", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout[out.stdout.index("{"):])
    for key in ("grpc_send_msg_s", "grpc_recv_ack_msg_s", "native_send_msg_s",
                "native_pop_ack_msg_s", "call_p50_ms", "echo_p50_ms"):
        assert result[key] > 0, key
    assert result["grpc_send_vs_native"] > 0 and result["grpc_recv_vs_native"] > 0
