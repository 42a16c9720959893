"""`lmq bench produce`: send throughput and latency of the native client's Producer.

Baseline, measured in the same run: the same SEND_MESSAGE_V2 requests (same body size,
same number of concurrent tasks, round robin over the same queues) invoked straight on
the client's RemotingClient — all that the broker and the transport cost, none of the
Producer's own work (validation, queue selection, ids, properties, retries). The Producer's
rate is printed as a ratio to it: 1.00 means the Producer adds nothing.

With ``--compare-cpp`` each run also drives the same load with the Apache C++ client as
the Python wheel `rocketmq` packages it (0.4.4: rocketmq-client-cpp 1.2.3, called through
ctypes) in a child process: ``--tasks`` Python threads each looping on the wheel's
``send_sync`` (the ctypes calls release the GIL) of a fresh ``--size``-byte message to the
same topic for ``--duration`` s, counting acknowledged sends. This is not a C++ program:
every send also pays the wheel's Python and ctypes layer, so the figure is "the C++
client driven from Python", not the C++ client's own ceiling. Printed: its rate and ours /
that rate (``ratio_vs_cpp``). Figures are medians of ``--runs``.

    lmq bench produce                       # starts `lmq serve` in a temp dir
    lmq bench produce -n 127.0.0.1:9876 --tasks 32 --size 1024 --mode async --json
    lmq bench produce --compare-cpp --runs 3 -d 5
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import trio

from lmq.bench._client_common import (
    Progress,
    add_common_arguments,
    baseline_rows,
    create_topic,
    latency_summary,
    median_of,
    ratio,
    report,
    run_on_server,
)
from lmq.bench._cpp_load import CPP_DRIVER, CppLoadError, cpp_produce, options_refused

MODES = ("sync", "async", "oneway", "batch")


def add_arguments(parser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--mode", choices=MODES, default="sync", help="send mode (default sync)")
    parser.add_argument("--batch", type=int, default=32, help="messages per batch (--mode batch)")


def run(args) -> int:
    if args.quick:
        args.duration, args.runs = 0.5, args.runs or 1
    args.runs = args.runs or 3
    if options_refused(args, "produce", ("tasks", "size", "batch", "runs", "duration"),
                       None if args.mode == "sync" else
                       "--compare-cpp measures sync sends (--mode sync)"):
        return 2
    result = run_on_server(_main, args)
    rows = [("mode", f"{args.mode} ({args.tasks} tasks, {args.size} B bodies), "
                     f"median of {args.runs} run(s) x {args.duration:g} s"),
            ("messages", f"{result['messages']:,.0f} in {result['seconds']:.1f} s"),
            ("producer", f"{result['msgs_per_s']:,.0f} msgs/s, {result['mib_per_s']:.2f} MiB/s"),
            ("errors", str(result["errors"]))]
    if result.get("latency"):
        rows.append(("latency", _latency_text(result["latency"])))
    rows += baseline_rows(result, "SEND_MESSAGE_V2")
    if result.get("cpp_msgs_per_s"):
        rows.append(("C++ client", f"{result['cpp_msgs_per_s']:,.0f} msgs/s via its Python wheel "
                                   f"`rocketmq` (ctypes; {args.tasks} Python threads on "
                                   f"send_sync), {result['cpp_errors']} errors"))
        if result.get("cpp_latency"):
            rows.append(("C++ latency", _latency_text(result["cpp_latency"])))
        if result.get("cpp_first_error"):
            rows.append(("C++ 1st error", result["cpp_first_error"][:160]))
        rows.append(("vs C++", f"{result['ratio_vs_cpp']:.2f} x the C++ client via its Python wheel "
                               f"(ours / the wheel's rate; not a C++ program's ceiling)"))
    if result.get("cpp_error"):
        rows.append(("C++ client", f"failed: {result['cpp_error']}"))
    report(result, args.json, rows)
    return 0 if result["messages"] and not result.get("cpp_error") else 1


def _latency_text(lat: dict[str, float]) -> str:
    return (f"p50 {lat['p50_ms']} ms, p90 {lat['p90_ms']} ms, "
            f"p99 {lat['p99_ms']} ms, p99.9 {lat['p99.9_ms']} ms")


async def _main(args, namesrv: str) -> dict[str, Any]:
    from core.client import ClientInstance

    async with ClientInstance(namesrv_addr=namesrv, request_timeout=10) as client:
        await create_topic(client, args.topic, args.queues)
        runs: list[dict[str, Any]] = []
        cpp_error = None
        for _ in range(args.runs):
            # Phases of a run back to back, so machine load drifts alike over all of them.
            one: dict[str, Any] = {}
            if not args.no_baseline:
                one["baseline_msgs_per_s"] = round(await _baseline(client, args), 1)
            one.update(await _producer_phase(client, args))
            if args.compare_cpp and cpp_error is None:
                try:
                    cpp = await cpp_produce(namesrv, args.topic, args.size, args.tasks, args.duration)
                except CppLoadError as exc:
                    cpp_error = str(exc)
                else:
                    one.update({"cpp_msgs_per_s": cpp["msgs_per_s"], "cpp_errors": cpp["errors"],
                                "cpp_latency": cpp.get("latency"),
                                "cpp_first_error": cpp.get("first_error")})
            runs.append(one)
    result: dict[str, Any] = {"mode": args.mode, "tasks": args.tasks, "size": args.size,
                              "topic": args.topic, "runs": args.runs, "duration": args.duration}
    result.update(median_of(runs, ("messages", "seconds", "msgs_per_s", "mib_per_s", "latency",
                                    "baseline_msgs_per_s", "cpp_msgs_per_s", "cpp_latency")))
    result["errors"] = sum(r["errors"] for r in runs)
    if result.get("baseline_msgs_per_s"):
        result["ratio"] = ratio(result["msgs_per_s"], result["baseline_msgs_per_s"])
    if args.compare_cpp:
        result["cpp_driver"] = CPP_DRIVER
        if "cpp_msgs_per_s" in result:
            result["cpp_errors"] = sum(r.get("cpp_errors", 0) for r in runs)
            result["ratio_vs_cpp"] = ratio(result["msgs_per_s"], result["cpp_msgs_per_s"])
            first = next((r["cpp_first_error"] for r in runs if r.get("cpp_first_error")), None)
            if first:
                result["cpp_first_error"] = first
        if cpp_error:
            result["cpp_error"] = cpp_error
    result["per_run"] = {k: [r.get(k) for r in runs]
                         for k in ("msgs_per_s", "baseline_msgs_per_s", "cpp_msgs_per_s")
                         if any(r.get(k) is not None for r in runs)}
    return result


async def _baseline(client, args) -> float:
    """Raw SEND_MESSAGE_V2 through the RemotingClient, same shape of load."""
    route = client.routes[args.topic]
    queues = route.publish_queues(args.topic)
    body = b"x" * args.size
    cursor = itertools.count()
    progress = Progress("baseline", args.json)
    count = 0

    async def task() -> None:
        nonlocal count
        while True:
            mq = queues[next(cursor) % len(queues)]
            addr = client.find_broker_addr(mq.broker_name)
            ext = {"a": "BENCH_PG", "b": args.topic, "c": "TBW102", "d": "4", "e": str(mq.queue_id),
                   "f": "0", "g": str(int(time.time() * 1000)), "h": "0", "i": "", "j": "0",
                   "k": "false", "m": "false"}
            await client.api.send_message(addr, mq, ext, body, batch=False, uniq_id="")
            count += 1
            progress.count = count

    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress.run)
        for _ in range(args.tasks):
            nursery.start_soon(task)
        await trio.sleep(args.duration)
        nursery.cancel_scope.cancel()
    progress.done()
    return count / (time.monotonic() - start)


async def _producer_phase(client, args) -> dict[str, Any]:
    from core.client import Message, Producer

    body = b"x" * args.size
    latencies: list[float] = []
    progress = Progress(f"producer/{args.mode}", args.json)

    async with Producer(client, "BENCH_PG", send_timeout=10) as producer:
        async def sync_task() -> None:
            while True:
                t0 = time.monotonic()
                try:
                    await producer.send(Message(args.topic, body))
                except Exception:
                    progress.errors += 1
                    continue
                latencies.append(time.monotonic() - t0)
                progress.count += 1

        async def oneway_task() -> None:
            while True:
                await producer.send_oneway(Message(args.topic, body))
                progress.count += 1

        async def batch_task() -> None:
            while True:
                t0 = time.monotonic()
                try:
                    await producer.send_batch([Message(args.topic, body) for _ in range(args.batch)])
                except Exception:
                    progress.errors += 1
                    continue
                latencies.append(time.monotonic() - t0)
                progress.count += args.batch

        async def async_driver() -> None:
            # `tasks` sends in flight, each started with send_async and finished by callback.
            slots = trio.Semaphore(args.tasks)

            def done(result, error) -> None:
                if error is None:
                    progress.count += 1
                else:
                    progress.errors += 1
                slots.release()

            while True:
                await slots.acquire()
                producer.send_async(Message(args.topic, body), done)

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            if args.mode == "async":
                nursery.start_soon(async_driver)
            else:
                fn = {"sync": sync_task, "oneway": oneway_task, "batch": batch_task}[args.mode]
                for _ in range(args.tasks):
                    nursery.start_soon(fn)
            await trio.sleep(args.duration)
            nursery.cancel_scope.cancel()
        elapsed = time.monotonic() - start
        progress.done()
    n = progress.count
    out: dict[str, Any] = {
        "messages": n,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(n / elapsed, 1),
        "mib_per_s": round(n * args.size / elapsed / (1 << 20), 3),
        "errors": progress.errors,
    }
    if latencies:
        out["latency"] = latency_summary(latencies)
    return out
