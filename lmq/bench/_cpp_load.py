"""The C++ client of the `rocketmq` wheel (0.4.4, rocketmq-client-cpp 1.2.3,
docs/protocol.md §0) as the comparison load of `lmq bench produce|consume --compare-cpp`.

What it measures is the Apache C++ client driven from Python: the wheel's Python classes
calling the C++ library through ctypes, from Python threads. Every send or consumed message
also pays that layer, so the figures are not those of a C++ program using the library
directly; the bench output says "the C++ client via its Python wheel" (and the JSON
`cpp_driver` field what exactly) for that reason.

The wheel's native threads (network, rebalance, consume pool) must not share a process
with the bench's trio loop, so the load runs in a child process:

    python -m lmq.bench._cpp_load produce --namesrv ADDR --topic T --size N --threads K --duration S
    python -m lmq.bench._cpp_load consume --namesrv ADDR --topic T --messages N --threads K --timeout S

The child prints one JSON object on its last stdout line and leaves with `os._exit`, so a
slow or hung native shutdown (or the wheel's `__del__` shutting down twice) cannot keep it
alive. Its HOME is a temporary directory the parent removes: the C++ client writes its
logs under `$HOME/logs/rocketmq-cpp/` (the wheel's SetProducerLogPath is a no-op).

The parent side (`cpp_produce`, `cpp_consume`) is async and bounded by a deadline; on
cancellation trio kills the child.

GIL: the wheel binds the library with `ctypes.cdll` (CDLL, not PyDLL), so every native call
— SendMessageSync included — runs with the GIL released; K Python threads looping on
`send_sync` keep K sends in flight. The consumer's callback re-acquires the GIL once per
message (CFUNCTYPE), as any user of the wheel pays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

# How long the child may spend outside the measured window: start, route lookup, the
# warm-up send, and the native shutdown (watchdog). Generous: the machine may be loaded.
STARTUP_S = 20.0
SHUTDOWN_S = 10.0
SEND_TIMEOUT_MS = 10_000  # = our producer's send_timeout in the bench
# What --compare-cpp figures measure (reported with them).
CPP_DRIVER = ("Apache rocketmq-client-cpp 1.2.3 through the Python wheel rocketmq 0.4.4 "
              "(ctypes), driven by Python threads")
LOG_LEVEL_WARN = 3  # rocketmq-client-cpp CLogLevel: per-pull INFO lines would slow it down


class CppLoadError(RuntimeError):
    """The C++ load could not run or did not report."""


def cpp_unavailable() -> str | None:
    """Why the C++ comparison cannot run here, or None when the wheel is importable."""
    import importlib.util

    if importlib.util.find_spec("rocketmq") is None:
        return "--compare-cpp needs the `rocketmq` wheel (pip install rocketmq==0.4.4)"
    return None


# --- parent side --------------------------------------------------------------------------

def options_refused(args: argparse.Namespace, command: str, positive: tuple[str, ...],
                    unsupported: str | None) -> bool:
    """Whether `lmq bench <command>` cannot run with `args`: one of the options `positive`
    is not above 0, or --compare-cpp is asked for where it cannot run (the wheel is
    missing, or `unsupported` says why not with these options). Prints why; the caller
    exits 2."""
    if any(getattr(args, name) <= 0 for name in positive):
        names = [f"--{name}" for name in positive]
        print(f"lmq bench {command}: {', '.join(names[:-1])} and {names[-1]} must be positive")
        return True
    if not args.compare_cpp:
        return False
    why = cpp_unavailable() or unsupported
    if why:
        print(f"lmq bench {command}: {why}")
    return bool(why)


async def cpp_produce(namesrv: str, topic: str, size: int, threads: int,
                      duration: float) -> dict[str, Any]:
    """Sync sends of `size`-byte bodies to `topic` from `threads` threads for `duration` s.

    Returns msgs_per_s, messages, seconds, errors and latency (p50_ms ... p99.9_ms)."""
    return await _run_child(
        ["produce", "--namesrv", namesrv, "--topic", topic, "--size", str(size),
         "--threads", str(threads), "--duration", str(duration)],
        deadline=duration + STARTUP_S + SHUTDOWN_S + SEND_TIMEOUT_MS / 1000)


async def cpp_consume(namesrv: str, topic: str, messages: int, threads: int,
                      timeout: float) -> dict[str, Any]:
    """A fresh clustering PushConsumer group reads `messages` messages of `topic` (from the
    first offset: a new group on a queue whose min offset is 0 starts at 0, docs/protocol.md §5.3).

    Returns msgs_per_s, messages, seconds (start() to the last callback) and first_msg_s."""
    return await _run_child(
        ["consume", "--namesrv", namesrv, "--topic", topic, "--messages", str(messages),
         "--threads", str(threads), "--timeout", str(timeout)],
        deadline=timeout + STARTUP_S + SHUTDOWN_S)


async def _run_child(argv: list[str], deadline: float) -> dict[str, Any]:
    import trio

    home = tempfile.mkdtemp(prefix="lmq-bench-cpp-")
    env = dict(os.environ, HOME=home)
    try:
        with trio.move_on_after(deadline) as scope:
            proc = await trio.run_process([sys.executable, "-m", "lmq.bench._cpp_load", *argv],
                                          capture_stdout=True, capture_stderr=True,
                                          check=False, env=env)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if scope.cancelled_caught:
        raise CppLoadError(f"the C++ {argv[0]} load did not finish within {deadline:.0f} s")
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = proc.stderr.decode(errors="replace").strip()[-600:]
        raise CppLoadError(f"the C++ {argv[0]} load failed (exit {proc.returncode}): {tail}") from None
    if "error" in result:
        raise CppLoadError(f"the C++ {argv[0]} load failed: {result['error']}")
    return result


# --- child side ---------------------------------------------------------------------------

def _latency(values: list[float]) -> dict[str, float]:
    from lmq.bench._client_common import latency_summary

    return latency_summary(values)


def _produce(o: argparse.Namespace) -> dict[str, Any]:
    from rocketmq.client import Message, Producer
    from rocketmq.ffi import dll

    producer = Producer(f"BENCH_CPP_PG_{os.getpid()}", timeout=SEND_TIMEOUT_MS)
    producer.set_namesrv_addr(o.namesrv)
    dll.SetProducerLogLevel(producer._handle, LOG_LEVEL_WARN)
    producer.start()
    body = b"x" * o.size

    def send() -> None:
        msg = Message(o.topic)  # a fresh message per send, as the bench's own producer does
        msg.set_body(body)
        producer.send_sync(msg)

    # Warm-up outside the window: the C++ producer looks the route up at its first send and
    # opens the broker connection then; ours has both before its window starts.
    warm_until = time.monotonic() + STARTUP_S
    while True:
        try:
            send()
            break
        except Exception as exc:
            if time.monotonic() > warm_until:
                return {"error": f"no send succeeded in {STARTUP_S:.0f} s: {exc}"}
            time.sleep(0.2)

    counts = [0] * o.threads
    errors = [0] * o.threads
    latencies: list[list[float]] = [[] for _ in range(o.threads)]
    go, stop = threading.Event(), threading.Event()
    window: list[float] = []
    first_error: list[str] = []

    def worker(i: int) -> None:
        go.wait()
        end = window[1]
        lat = latencies[i]
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                send()
            except Exception as exc:
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            t1 = time.monotonic()
            if t1 <= end:  # count only sends acknowledged inside the window
                counts[i] += 1
                lat.append(t1 - t0)

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(o.threads)]
    for t in pool:
        t.start()
    start = time.monotonic()
    window[:] = [start, start + o.duration]
    go.set()
    time.sleep(o.duration)
    stop.set()
    for t in pool:
        t.join(SEND_TIMEOUT_MS / 1000 + 1)
    n = sum(counts)
    out = {"messages": n, "seconds": round(o.duration, 3),
           "msgs_per_s": round(n / o.duration, 1), "errors": sum(errors),
           "threads": o.threads}
    all_lat = [x for lat in latencies for x in lat]
    if all_lat:
        out["latency"] = _latency(all_lat)
    if first_error:
        out["first_error"] = first_error[0]
    _shutdown_later(producer)
    return out


def _consume(o: argparse.Namespace) -> dict[str, Any]:
    from rocketmq.client import PushConsumer
    from rocketmq.ffi import dll

    consumer = PushConsumer(f"BENCH_CPP_CG_{os.getpid()}_{time.time_ns()}")  # fresh group
    consumer.set_namesrv_addr(o.namesrv)
    consumer.set_thread_count(o.threads)
    dll.SetPushConsumerLogLevel(consumer._handle, LOG_LEVEL_WARN)
    lock = threading.Lock()
    done = threading.Event()
    state = {"n": 0, "first": 0.0, "last": 0.0}

    def on_message(msg) -> None:
        with lock:
            now = time.monotonic()
            state["n"] += 1
            if state["n"] == 1:
                state["first"] = now
            if state["n"] == o.messages:
                state["last"] = now
                done.set()

    consumer.subscribe(o.topic, on_message)
    start = time.monotonic()
    consumer.start()
    finished = done.wait(o.timeout)
    with lock:
        n = state["n"]
        end = state["last"] if finished else time.monotonic()
        first = state["first"]
    elapsed = max(end - start, 1e-9)
    out = {"messages": n, "seconds": round(elapsed, 3), "msgs_per_s": round(n / elapsed, 1),
           "first_msg_s": round(first - start, 3) if n else None, "threads": o.threads,
           "complete": finished}
    _shutdown_later(consumer)
    return out


def _shutdown_later(client) -> None:
    """Shut `client` down in the background; the child exits when that is done or after
    SHUTDOWN_S, whichever comes first (see main)."""
    threading.Thread(target=client.shutdown, daemon=True, name="cpp-shutdown").start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lmq.bench._cpp_load")
    parser.add_argument("load", choices=("produce", "consume"))
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0)
    o = parser.parse_args(argv)
    try:
        result = (_produce if o.load == "produce" else _consume)(o)
    except Exception as exc:  # reported to the parent, which prints it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    for t in threading.enumerate():
        if t.name == "cpp-shutdown":
            t.join(SHUTDOWN_S)
    os._exit(0)  # never run the wheel's __del__ (a second native shutdown) at exit


if __name__ == "__main__":
    main()
