"""Shared parts of `lmq bench produce` and `lmq bench consume`: the server under test, the
live progress line, percentiles, medians over runs and the report."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import trio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_common_arguments(parser) -> None:
    parser.add_argument("-n", "--namesrv-addr",
                        help="cluster to measure (default: start `lmq serve` in a temp dir)")
    parser.add_argument("-t", "--topic", default="BenchClientTopic")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent tasks (default 16)")
    parser.add_argument("-s", "--size", type=int, default=256, help="message body bytes")
    parser.add_argument("-d", "--duration", type=float, default=5.0, help="seconds per phase")
    parser.add_argument("--queues", type=int, default=4, help="queues of the topic (default 4)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline phase")
    parser.add_argument("--runs", type=int, default=None,
                        help="repetitions of every phase; medians are reported (default 3, --quick 1)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one short run (for tests, not for figures)")
    parser.add_argument("--compare-cpp", action="store_true",
                        help="also run the same load with the C++ client of the `rocketmq` wheel "
                             "(in a child process) and print ours / C++")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


@contextlib.contextmanager
def server_under_test(namesrv_addr: str | None) -> Iterator[str]:
    """Yield a name-server address: the given one, or a fresh `lmq serve` child process."""
    if namesrv_addr:
        yield namesrv_addr
        return
    data = tempfile.mkdtemp(prefix="lmq-bench-client-")
    ns_port, broker_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--host", "127.0.0.1", "--data-dir", data,
         "--namesrv-port", str(ns_port), "--broker-port", str(broker_port), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", broker_port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("`lmq serve` did not start") from None
                time.sleep(0.1)
        time.sleep(0.5)  # let the broker register with its name server
        yield f"127.0.0.1:{ns_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)


def run_on_server(main, args) -> dict[str, Any]:
    """`await main(args, namesrv)` in a trio run against the server under test."""
    with server_under_test(args.namesrv_addr) as ns:
        return trio.run(main, args, ns)


class Progress:
    """Counts work and prints one self-overwriting line per second to stderr."""

    def __init__(self, label: str, quiet: bool = False) -> None:
        self.label = label
        self.count = 0
        self.bytes = 0
        self.errors = 0
        self.quiet = quiet or not sys.stderr.isatty()

    async def run(self) -> None:
        last, last_t = 0, time.monotonic()
        while True:
            await trio.sleep(1.0)
            now = time.monotonic()
            rate = (self.count - last) / (now - last_t)
            last, last_t = self.count, now
            if not self.quiet:
                print(f"\r{self.label}: {self.count} msgs, {rate:,.0f}/s, {self.errors} errors   ",
                      end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if not self.quiet:
            print("\r" + " " * 70 + "\r", end="", file=sys.stderr, flush=True)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    values = sorted(latencies_s)
    return {f"p{p}_ms": round(percentile(values, p) * 1000, 3) for p in (50, 90, 99, 99.9)}


def median_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Per key, the median of the runs' numbers (nested dicts such as latency: per field);
    keys no run has are left out."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        if not values:
            continue
        if isinstance(values[0], dict):
            out[key] = {f: round(statistics.median(v[f] for v in values), 3) for f in values[0]}
        else:
            out[key] = round(statistics.median(values), 3)
    return out


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs, or None when either is missing or theirs is zero."""
    return round(ours / theirs, 3) if ours is not None and theirs else None


def baseline_rows(result: dict[str, Any], request: str) -> list[tuple[str, str]]:
    """The report rows of the raw-`request` baseline, if it was measured."""
    if not result.get("baseline_msgs_per_s"):
        return []
    return [("baseline", f"{result['baseline_msgs_per_s']:,.0f} msgs/s (raw {request})"),
            ("ratio", f"{result['ratio']:.2f} x baseline")]


async def create_topic(client, topic: str, queues: int) -> None:
    """Creates `topic` and waits for its route (a C++ client started next finds the route
    at once instead of at its 30 s poll)."""
    from core.client import AdminClient

    await AdminClient(client).topic_create(topic, read_queue_nums=queues,
                                           write_queue_nums=queues)
    while await client.update_route(topic) is None:
        await trio.sleep(0.1)


def report(result: dict[str, Any], as_json: bool, rows: list[tuple[str, str]]) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")


def cpu_count() -> int:
    return os.cpu_count() or 1
