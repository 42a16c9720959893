"""`lmq bench mqtt --gateways 2` (lmq/bench/_mqtt_gateways.py): the two-gateway server
really is two gateway processes, subscribers really read from the second one, and a
closed-loop QoS 1 phase across them comes out whole. No speed is judged here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from lmq.bench import _mqtt_gateways
from lmq.bench._mqtt_gateways import NAME, start_two_gateways
from lmq.bench.mqtt import options, run_phase
from tests.bench.mqtt_support import TINY

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two():
    tmp = tempfile.mkdtemp(prefix="lmq-bench-2gw-test-")
    opts = options([*TINY, "--publishers", "2", "--window", "200", "--gateways", "2"])
    server = start_two_gateways(opts, tmp)
    try:
        yield opts, server
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _listeners(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def test_second_gateway_is_a_child_of_the_first_and_listens_apart(two) -> None:
    _opts, server = two
    children = psutil.Process(server.pid).children()
    assert len(children) == 1  # lmq mqtt: counted in the server's CPU figure
    assert "mqtt" in children[0].cmdline()
    assert server.port in _listeners(server.pid)
    assert server.sub_port in _listeners(children[0].pid)
    assert server.sub_port not in _listeners(server.pid)


@pytest.mark.parametrize("phase", ["fanin_qos1", "fanout10_qos1"])
def test_qos1_phase_across_two_gateways_delivers_everything(two, phase, monkeypatch) -> None:
    opts, server = two
    child = psutil.Process(server.pid).children()[0]
    seen: set[int] = set()
    real = _mqtt_gateways.place_subscribers

    def spy(o, port, jobs_sub):
        real(o, port, jobs_sub)
        seen.update(j.port for j in jobs_sub)

    monkeypatch.setattr(_mqtt_gateways, "place_subscribers", spy)
    r = run_phase(phase, opts, server, f"t{phase[-6:]}")
    assert seen == {server.sub_port}
    assert r["delivered_per_s"] > 0
    assert r["missing"] == 0
    assert child.is_running()


def test_bench_reports_both_servers_side_by_side() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lmq", "bench", "mqtt", "--quick", "--json", "--pin", "off",
         "--gateways", "2", "--phases", "fanin_qos1", "--drain", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)["results"]
    assert set(results) == {"lmq", NAME}
    assert results[NAME]["fanin_qos1"]["missing"] == 0
    assert results[NAME]["fanin_qos1"]["delivered_per_s"] > 0
