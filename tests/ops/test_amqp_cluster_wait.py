"""`lmq amqp` started with no master broker: after its start-up wait (`--cluster-wait`,
short here) it exits 1 with one line naming the cause and the fix, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.gateway.mqtt.e2e_support import free_port
from tests.ops.test_metrics import REPO, Proc, _dir

pytestmark = pytest.mark.timeout(120)


def _amqp(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmq", "amqp", "--amqp-port", "0", *argv],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("namesrv", ["down", "up without brokers"])
def test_no_master_broker_is_one_line_after_the_wait(tmp_path, namesrv):
    port = free_port()
    ns = None
    try:
        if namesrv != "down":
            ns = Proc(["namesrv", "--port", str(port), "--metrics-port", "0"],
                      _dir(tmp_path / "ns"))
            ns.wait_ready()
        r = _amqp("--namesrv-addr", f"127.0.0.1:{port}", "--cluster-wait", "0.5")
    finally:
        if ns is not None:
            ns.stop()
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "waiting for a master broker registered with" in lines[0]
    assert "(at most 0.5 s)" in lines[0]
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1 and errors[0] == lines[-1], r.stderr
    assert errors[0].endswith(
        f"lmq.amqp: cannot start: no master broker registered with the name server(s) "
        f"127.0.0.1:{port} within 0.5 s: start the cluster first, or check --namesrv-addr")


def test_bad_cluster_wait_refused():
    r = _amqp("--cluster-wait", "soon")
    assert r.returncode == 2
    assert "expected seconds in 0.1..3600, got 'soon'" in r.stderr, r.stderr
