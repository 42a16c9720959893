"""A live progress line for long-running commands, on a terminal only.

    with Progress("lmq bench store"):
        progress.phase("raw pack ceiling")
        ...

On a terminal (standard error is a TTY) one line is redrawn in place every
`REDRAW_INTERVAL_S`: the label, the current phase, its step count when given, and the
time since the command started. Piped or redirected, nothing is written, so output that
is read by programs (tables, `--json`) stays clean. While the line is shown, whatever the
command prints to standard output first clears it (the line comes back at the next redraw),
so printed rows and the live line never share a line.

`phase()` and `step()` are module functions, so a benchmark module can report phases
without knowing whether a progress line is shown (they do nothing when none is).

A command whose progress is also read from its logs (`lmq demo iot` under
`docker compose logs`) passes `plain_every=SECONDS`: on a terminal it gets the live line,
otherwise `status(text)` prints the line as a plain line of its own at most once per
`plain_every` seconds. `interval` says how often the command should call `status()`.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time

__all__ = ["Progress", "phase", "step"]

REDRAW_INTERVAL_S = 0.5
_CLEAR = "\r\x1b[K"  # carriage return + erase to the end of the line

_current: Progress | None = None


def phase(text: str, total: int | None = None) -> None:
    """Name what the command does now (a new phase restarts the step count)."""
    if _current is not None:
        _current.set_phase(text, total)


def step(done: int) -> None:
    """How many of the phase's `total` steps are done."""
    if _current is not None:
        _current.done = done


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


class _ClearingStdout:
    """Wraps sys.stdout: a write first erases the live line from the terminal."""

    def __init__(self, inner, progress: Progress) -> None:
        self._inner = inner
        self._progress = progress

    def write(self, text: str) -> int:
        self._progress.clear()
        return self._inner.write(text)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Progress:
    def __init__(self, label: str, stream=None, *, enabled: bool | None = None,
                 plain_every: float | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        # Not a terminal: plain lines at most this often (None: silent).
        self.plain_every = None if self.enabled else plain_every
        self._plain_due = 0.0  # monotonic time of the next plain line
        self.text = "starting"
        self.total: int | None = None
        self.done = 0
        self._t0 = time.monotonic()
        self._shown = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stdout = None

    def set_phase(self, text: str, total: int | None = None) -> None:
        self.text, self.total, self.done = text, total, 0
        self.draw()

    @property
    def interval(self) -> float | None:
        """How often a caller feeding `status()` should refresh it (None: nothing shown)."""
        return REDRAW_INTERVAL_S if self.enabled else self.plain_every

    def status(self, text: str) -> None:
        """Replace the text (the step count is kept); not on a terminal and with
        `plain_every`, print it as a line of its own unless one was printed less than
        `plain_every` seconds ago. On a terminal the next redraw shows it."""
        self.text = text
        if self.plain_every is None:
            return
        now = time.monotonic()
        if now < self._plain_due:
            return
        # On schedule (a caller refreshing every `interval` prints every time), never
        # twice in a burst after a stall.
        due = self._plain_due + self.plain_every
        self._plain_due = due if due > now else now + self.plain_every
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def line(self) -> str:
        count = f" {self.done}/{self.total}" if self.total else ""
        return f"{self.label}: {self.text}{count} ({time.monotonic() - self._t0:.0f} s)"

    def draw(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            try:
                width = os.get_terminal_size(self.stream.fileno()).columns or 80
            except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
                width = 80
            self.stream.write(_CLEAR + self.line()[: max(10, width - 1)])
            self.stream.flush()
            self._shown = True

    def clear(self) -> None:
        if self._shown:
            with self._lock:
                self.stream.write(_CLEAR)
                self.stream.flush()
                self._shown = False

    def _run(self) -> None:
        while not self._stop.wait(REDRAW_INTERVAL_S):
            self.draw()

    def __enter__(self) -> Progress:
        global _current
        _current = self
        if self.enabled:
            self._stdout = sys.stdout
            sys.stdout = _ClearingStdout(sys.stdout, self)
            self.draw()
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        global _current
        _current = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._stdout is not None:
            sys.stdout = self._stdout
        self.clear()
