"""`lmq bench produce`: send throughput and latency of the native client's Producer.

Baseline, measured in the same run: the same SEND_MESSAGE_V2 requests (same body size,
same number of concurrent tasks, round robin over the same queues) invoked straight on
the client's RemotingClient — all that the broker and the transport cost, none of the
Producer's own work (validation, queue selection, ids, properties, retries). The Producer's
rate is printed as a ratio to it: 1.00 means the Producer adds nothing.

    lmq bench produce                       # starts `lmq serve` in a temp dir
    lmq bench produce -n 127.0.0.1:9876 --tasks 32 --size 1024 --mode async --json
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import trio

from bench._client_common import (
    Progress,
    add_common_arguments,
    latency_summary,
    report,
    server_under_test,
)

MODES = ("sync", "async", "oneway", "batch")


def add_arguments(parser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--mode", choices=MODES, default="sync", help="send mode (default sync)")
    parser.add_argument("--batch", type=int, default=32, help="messages per batch (--mode batch)")


def run(args) -> int:
    if args.tasks < 1 or args.size < 1 or args.duration <= 0 or args.batch < 1:
        print("lmq bench produce: --tasks, --size, --batch and --duration must be positive")
        return 2
    with server_under_test(args.namesrv_addr) as ns:
        result = trio.run(_main, args, ns)
    rows = [("mode", f"{args.mode} ({args.tasks} tasks, {args.size} B bodies)"),
            ("messages", f"{result['messages']:,} in {result['seconds']:.1f} s"),
            ("producer", f"{result['msgs_per_s']:,.0f} msgs/s, {result['mib_per_s']:.2f} MiB/s"),
            ("errors", str(result["errors"]))]
    if result.get("latency"):
        lat = result["latency"]
        rows.append(("latency", f"p50 {lat['p50_ms']} ms, p90 {lat['p90_ms']} ms, "
                                f"p99 {lat['p99_ms']} ms, p99.9 {lat['p99.9_ms']} ms"))
    if result.get("baseline_msgs_per_s"):
        rows.append(("baseline", f"{result['baseline_msgs_per_s']:,.0f} msgs/s (raw SEND_MESSAGE_V2)"))
        rows.append(("ratio", f"{result['ratio']:.2f} x baseline"))
    report(result, args.json, rows)
    return 0 if result["messages"] else 1


async def _main(args, namesrv: str) -> dict[str, Any]:
    from core.client import AdminClient, ClientInstance

    async with ClientInstance(namesrv_addr=namesrv, request_timeout=10) as client:
        await AdminClient(client).topic_create(args.topic, read_queue_nums=args.queues,
                                               write_queue_nums=args.queues)
        while await client.update_route(args.topic) is None:
            await trio.sleep(0.1)
        result: dict[str, Any] = {"mode": args.mode, "tasks": args.tasks, "size": args.size,
                                  "topic": args.topic}
        if not args.no_baseline:
            base = await _baseline(client, args)
            result["baseline_msgs_per_s"] = round(base, 1)
        result.update(await _producer_phase(client, args))
        if result.get("baseline_msgs_per_s"):
            result["ratio"] = round(result["msgs_per_s"] / result["baseline_msgs_per_s"], 3)
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
