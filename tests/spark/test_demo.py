"""`lmq demo iot` end to end, briefly: simulator -> MQTT -> Spark -> Parquet and alerts."""

from __future__ import annotations

import calendar
import importlib.util
import json
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.spark.conftest import REPO

pytestmark = pytest.mark.slow

# The MQTT gateway delivers what other writers (the Spark sink) put into its LMQs once it
# watches them (the shared routing table's gateway, issue 12).
DELIVERS_FOREIGN_WRITES = importlib.util.find_spec("gateway.mqtt.lmq_watch") is not None


def test_demo_iot_aggregates_and_alerts_match_the_readings(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "iot"
    threshold = 25.0
    proc = subprocess.run(
        [sys.executable, "-m", "lmq", "demo", "iot", "--devices", "2", "--rate", "5",
         "--duration", "8", "--window", "2", "--watermark", "1", "--threshold", str(threshold),
         "--master", "local[1]", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    readings = [json.loads(line) for line in (out / "readings.jsonl").read_text().splitlines()]
    assert len(readings) >= 10
    assert "readings sent" in proc.stdout                          # live progress lines

    # every reading above the threshold became exactly one alert, stored as MQTT traffic
    m = re.search(r"stopped: ([\d,]+) readings sent, ([\d,]+) alerts written to "
                  r"alerts/<device>, ([\d,]+) received over MQTT", proc.stdout)
    assert m, proc.stdout[-2000:]
    hot = [r for r in readings if r["temperature"] > threshold]
    assert int(m.group(1).replace(",", "")) == len(readings)
    assert int(m.group(2).replace(",", "")) == len(hot)
    if DELIVERS_FOREIGN_WRITES:
        # ... and reached the operator's MQTT subscription on alerts/#, once each
        got = [json.loads(line) for line in
               (out / "alerts_received.jsonl").read_text().splitlines()]
        assert sorted((g["topic"], g["alert"]["ts"]) for g in got) == \
            sorted((f"alerts/{r['device']}", r["ts"]) for r in hot)

    # each closed window's aggregates, computed here from the readings the simulator sent
    rows = pq.read_table(out / "aggregates").to_pylist()
    assert rows, "no window was closed"
    by = defaultdict(list)
    for r in readings:
        by[(r["device"], r["ts"] // 2000 * 2000)].append(r)
    for row in rows:
        start_ms = calendar.timegm(row["window_start"].timetuple()) * 1000
        mine = by[(row["device"], start_ms)]
        assert row["readings"] == len(mine)
        assert row["max_temperature"] == max(r["temperature"] for r in mine)
        assert row["avg_temperature"] == pytest.approx(
            sum(r["temperature"] for r in mine) / len(mine))
        assert row["min_battery"] == min(r["battery"] for r in mine)
