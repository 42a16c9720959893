"""`lmq demo iot` reports its progress as a live line on a terminal and as plain lines
when piped (what `docker compose logs iot` shows): real demo, real Spark, real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ops.pty_run import run_in_pty

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]


def _demo(tmp_path) -> list[str]:
    return [sys.executable, "-m", "lmq", "demo", "iot", "--devices", "2", "--rate", "4",
            "--duration", "6", "--window", "2", "--watermark", "1", "--master", "local[1]",
            "--out", str(tmp_path / "iot")]


def test_demo_on_a_terminal_redraws_one_line(tmp_path):
    code, text, _ = run_in_pty(_demo(tmp_path), REPO, 300)
    assert code == 0, text[-3000:]
    live = re.findall(r"\r\x1b\[Klmq demo iot: (readings sent [\d,]+  rows in [\d,]+  "
                      r"batches \d+  backlog [\d-]+  alerts received [\d,]+)", text)
    assert len(live) >= 3, text[-3000:]            # redrawn, twice a second
    assert int(live[-1].split()[2].replace(",", "")) > 0
    # never a status line of its own: the line is redrawn in place
    assert not re.search(r"(^|\n)lmq demo iot: readings sent", text)
    assert "\r\x1b[Klmq demo iot: stopping: draining the queries" in text
    # the result is printed on a clean line after the live line was erased
    assert re.search(r"\r\x1b\[K\r?\n?stopped: [\d,]+ readings sent", text) or \
        re.search(r"\x1b\[Kstopped: [\d,]+ readings sent", text), text[-2000:]


def test_demo_piped_prints_plain_lines(tmp_path):
    r = subprocess.run(_demo(tmp_path), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "\x1b" not in r.stdout and "\r" not in r.stdout
    status = [line for line in r.stdout.splitlines()
              if line.startswith("lmq demo iot: readings sent ")]
    assert 2 <= len(status) <= 6, r.stdout          # every 2 s over a 6 s run
    assert r.stdout.splitlines()[-1].startswith("stopped: ")
