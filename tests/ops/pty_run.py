"""Run a command under a pseudo-terminal and collect everything it writes (ops tests)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_in_pty(cmd: list[str], cwd, timeout: float, env: dict | None = None,
               until: bytes | None = None) -> tuple[int | None, str, subprocess.Popen]:
    """(exit code or None when `until` was seen first, output, process). Standard output
    and error are the terminal (250 columns); TERM=xterm. With `until`, stops reading once the output
    holds it and leaves the process running (the caller ends it)."""
    main, side = pty.openpty()
    # 40 rows x 250 columns: wide enough that no live line is cut to the width
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 250, 0, 0))
    env = dict(os.environ if env is None else env, TERM="xterm")
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=side,
                            stderr=side, env=env)
    os.close(side)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if until is not None and until in out:
                return None, out.decode(errors="replace"), proc
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(main)
    return proc.wait(30), out.decode(errors="replace"), proc
