"""Start-up checks of the server commands, each failing with one line that names the cause
and the fix: config values of the wrong type, a data directory another server holds, a
port another process listens on."""

from __future__ import annotations

import dataclasses
import errno
import os
import socket
import types
import typing
from typing import Any

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOCK_FILE = ".lmq.lock"


def log_level(text: str) -> str:
    """argparse `type` of --log-level: one of LOG_LEVELS, any case."""
    import argparse

    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown level {text!r}: choose one of {', '.join(LOG_LEVELS)}")
    return level


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, set, tuple, frozenset):
        return isinstance(value, (list, set, tuple, frozenset))
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a type this check does not know: leave it to the code that uses it


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def config_type_error(config: Any, source: str = "the configuration") -> str | None:
    """The first field of dataclass `config` whose value does not have the declared type,
    as one line, or None. TOML gives typed values, so `file_reserved_hours = "abc"` is a
    string where a number belongs, and is refused before anything starts."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return mapping_type_error(type(config), values, source)


def mapping_type_error(cls: type, values: dict, source: str = "the configuration") -> str | None:
    """As `config_type_error`, for the keyword arguments of dataclass `cls` before it is
    built (its own checks may trip over a value of the wrong type first)."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        hint = hints.get(name)
        if hint is not None and not _matches(value, hint):
            return (f"bad value in {source}: {name} = {value!r} must be {_type_name(hint)} "
                    f"(fix it in the TOML file or the flag that sets it)")
    return None


def lock_data_dir(data_dir: str) -> tuple[int | None, str | None]:
    """Hold an exclusive advisory lock on DATA_DIR/.lmq.lock for the life of the process:
    (fd, None), or (None, the one-line error) when another server holds it."""
    import fcntl

    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return None, f"cannot use data directory {data_dir}: {exc.strerror} (choose another --data-dir)"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        return None, (f"data directory {os.path.abspath(data_dir)} is in use by another lmq "
                      f"server (pid {holder}): stop it, or give this one another --data-dir")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, None


def busy_listener(listeners: list[tuple[str, str, int | None]]) -> str | None:
    """After an EADDRINUSE at start-up: which of (name, host, port) cannot be bound, as one
    line, or None. (Port 0 and None are skipped: the system picks a free one.)"""
    for name, host, port in listeners:
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(host or "127.0.0.1", port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return (f"port {port} ({name}) on {host or '127.0.0.1'} is already in use "
                            f"by another process: stop it, or choose another port")
    return None
