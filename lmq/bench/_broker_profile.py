"""Optional sampling profile of the broker process while `lmq bench broker` loads it.

`Profiler` runs ``py-spy record --format raw`` (collapsed stacks, one line per distinct
stack: ``frame;frame;...;leaf count``) against the broker's pid for one phase, without
pausing it (``--nonblocking``: the figures of a profiled run are still indicative).
`hot_spots` turns the file into the two lists that say where to optimise: self time per
source line (the leaf frame) and inclusive time per function of our own code.
Idle time (the event loop waiting in epoll) is not sampled: py-spy skips idle threads.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["HotSpots", "Profiler", "hot_spots", "py_spy_path"]

# "function (path/to/file.py:123)"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*):(?P<line>\d+)\)$")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Our code, for the inclusive list (library frames like trio's run loop include everything).
_OWN_PREFIXES = ("core/", "bench/", "lmq/", "gateway/")


def py_spy_path() -> str | None:
    """The py-spy executable, or None when it is not installed."""
    return shutil.which("py-spy")


def _short(path: str) -> str:
    if path.startswith(_REPO):
        return path[len(_REPO):]
    marker = "site-packages" + os.sep
    i = path.find(marker)
    if i >= 0:
        return path[i + len(marker):]
    i = path.find("lib" + os.sep + "python3")
    if i >= 0:
        return "stdlib:" + os.path.basename(path)
    return path


@dataclass
class HotSpots:
    """Where the samples of one phase went (fractions of all samples)."""

    samples: int
    self_lines: list[tuple[str, float]] = field(default_factory=list)  # "file:line func"
    self_functions: list[tuple[str, float]] = field(default_factory=list)
    inclusive_own: list[tuple[str, float]] = field(default_factory=list)


def hot_spots(path: str, top: int = 15) -> HotSpots:
    """Summarise a py-spy raw (collapsed) file."""
    self_lines: Counter[str] = Counter()
    self_funcs: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = [_FRAME.match(f) for f in stack.split(";")]
            seen: set[str] = set()
            for m in frames:
                if m is None:
                    continue
                file = _short(m["file"])
                if file.startswith(_OWN_PREFIXES):
                    key = f"{file} {m['func']}"
                    if key not in seen:
                        seen.add(key)
                        inclusive[key] += n
            leaf = frames[-1]
            if leaf is not None:
                file = _short(leaf["file"])
                self_lines[f"{file}:{leaf['line']} {leaf['func']}"] += n
                self_funcs[f"{file} {leaf['func']}"] += n
            else:
                self_lines[stack.split(";")[-1]] += n
    if not total:
        return HotSpots(0)

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in counter.most_common(top)]

    return HotSpots(total, share(self_lines), share(self_funcs), share(inclusive))


class Profiler:
    """``with Profiler(pid, seconds, out_path): ...`` samples `pid` for `seconds`."""

    def __init__(self, pid: int, seconds: float, out_path: str, rate: int = 250) -> None:
        self.pid = pid
        self.seconds = max(1, int(round(seconds)))
        self.out_path = out_path
        self.rate = rate
        self._proc: subprocess.Popen | None = None
        self.error: str | None = None

    def start(self) -> None:
        exe = py_spy_path()
        if exe is None:
            self.error = "py-spy not installed (pip install py-spy)"
            return
        cmd = [exe, "record", "--pid", str(self.pid), "--duration", str(self.seconds),
               "--rate", str(self.rate), "--format", "raw", "--full-filenames",
               "--nonblocking", "-o", self.out_path]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self, timeout: float = 30.0) -> HotSpots | None:
        """Wait for py-spy and summarise; None (and `error` set) when it failed."""
        if self._proc is None:
            return None
        try:
            _, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            _, err = self._proc.communicate()
        if self._proc.returncode != 0 or not os.path.exists(self.out_path):
            self.error = (err or b"").decode("utf-8", "replace").strip()[-300:] or "py-spy failed"
            return None
        return hot_spots(self.out_path)
