"""The live progress line: shown on a terminal, absent when piped (real `lmq bench store`)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lmq import progress
from lmq.progress import Progress
from tests.ops.pty_run import run_in_pty

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "lmq", "bench", "store", "--quick", "--no-lmq-1m", "--json"]
pytestmark = pytest.mark.timeout(180)


def test_bench_piped_prints_only_its_result():
    r = subprocess.run(BENCH, cwd=REPO, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "put_msgs_per_s_1cq" in json.loads(r.stdout)


def test_bench_on_a_terminal_shows_a_live_line():
    code, text, _proc = run_in_pty(BENCH, REPO, 150)
    assert code == 0, text
    assert "\r\x1b[Klmq bench store: puts and gets" in text, text[:2000]
    assert "lmq bench store: restart after kill -9" in text
    # The line is erased before the result is printed, and the result is intact.
    result = text.rsplit("\x1b[K", 1)[-1].strip()
    assert "put_msgs_per_s_1cq" in json.loads(result)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_printed_rows_clear_the_line_first(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    err, out = _Tty(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with Progress("job", err):
        progress.phase("copying", total=3)
        progress.step(2)
        print("row 1")
        assert err.getvalue().endswith("\r\x1b[K")  # erased before the row
        progress.phase("checking")
    assert out.getvalue() == "row 1\n"
    assert "job: copying 0/3" in err.getvalue() and "job: checking" in err.getvalue()
    assert err.getvalue().endswith("\r\x1b[K")  # nothing left on the line at the end
    assert sys.stdout is out


def test_not_a_terminal_writes_nothing():
    err = io.StringIO()
    with Progress("job", err):
        progress.phase("copying")
    assert err.getvalue() == ""
    progress.phase("no progress shown: ignored")


def test_plain_every_prints_lines_when_not_a_terminal(monkeypatch):
    out = io.StringIO()
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with Progress("demo", out, plain_every=2.0) as p:
        assert p.interval == 2.0
        p.status("rows in 1")
        clock[0] += 0.5
        p.status("rows in 2")                 # too soon after the last line: not printed
        clock[0] += 1.6
        p.status("rows in 3")
        clock[0] += 60
        p.status("rows in 4")                 # after a stall: one line, not a burst
        p.status("rows in 5")
    lines = out.getvalue().splitlines()
    assert [line.split(": ", 1)[1].split(" (")[0] for line in lines] == \
        ["rows in 1", "rows in 3", "rows in 4"]
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_plain_every_on_a_terminal_is_the_live_line(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    err = _Tty()
    with Progress("demo", err, plain_every=2.0) as p:
        assert p.interval == progress.REDRAW_INTERVAL_S
        p.status("rows in 7")
        p.draw()
    text = err.getvalue()
    assert "\r\x1b[Kdemo: rows in 7" in text
    assert "\n" not in text                   # redrawn in place, never a new line


def test_dumb_terminal_gets_plain_lines(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    err = _Tty()
    with Progress("demo", err, plain_every=2.0) as p:
        p.status("rows in 9")
    assert err.getvalue().startswith("demo: rows in 9 (") and "\x1b" not in err.getvalue()
