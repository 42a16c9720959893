"""Atomic persistence of small JSON metadata files (topics, groups, offsets).

A file is replaced, never rewritten in place: write `<name>.tmp`, fsync it, rename it over
`<name>`, fsync the directory. A crash at any point leaves either the old or the new
content (Java's MixAll.string2File keeps a `.bak` for the same reason; rename is atomic on
POSIX, so we need no backup to read).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def encode_json(data: Any) -> bytes:
    """The bytes `atomic_write_json` writes (split out so callers can encode on the event
    loop and write from a worker thread)."""
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8")


def atomic_write_json(path: str, data: Any) -> None:
    """Replace `path` with the JSON encoding of `data`, atomically and durably."""
    atomic_write_bytes(path, encode_json(data))


def atomic_write_bytes(path: str, payload: bytes) -> None:
    """Replace `path` with `payload`: temp file, fsync, rename, fsync of the directory.
    Thread-safe for different paths; callers serialise writes of one path."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: str, default: Any = None) -> Any:
    """Load `path`; a missing file gives `default`. A corrupt file (impossible with
    atomic_write_json unless edited by hand) is logged, set aside as `.corrupt`, and
    `default` is returned so the broker still starts."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw)
    except ValueError:
        log.error("metadata file %s is not valid JSON; moved to %s.corrupt", path, path)
        os.replace(path, path + ".corrupt")
        return default
