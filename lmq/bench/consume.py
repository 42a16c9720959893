"""`lmq bench consume`: consume throughput of the native client's push or poll consumer.

The topic is first filled with ``--messages`` messages (batched sends). Baseline, measured
in the same run: raw PULL_MESSAGE loops over the same queues (one task per queue, 32
messages per pull, records decoded) — what the broker, the transport and decoding cost.
Then a fresh consumer group reads everything from the first offset with the chosen
consumer; its rate is printed as a ratio to the baseline (1.00 = the consumer's flow
control, dispatch, listener calls and offset bookkeeping cost nothing). A consumer's time
runs from its start to its last message, so it includes start-up and the first rebalance
(the time to the first message is printed too).

With ``--compare-cpp`` each run also reads the same messages with the C++ client of the
`rocketmq` wheel (rocketmq-client-cpp 1.2.3) in a child process: a clustering PushConsumer
of a fresh group with ``--tasks`` consume threads, counting in its per-message callback.
Printed: its rate and ours / C++ (``ratio_vs_cpp``). Figures are medians of ``--runs``.

    lmq bench consume                              # push consumer, async listener
    lmq bench consume --kind lite --messages 50000 --json
    lmq bench consume --compare-cpp --runs 3 --messages 50000
"""

from __future__ import annotations

import time
from typing import Any

import trio

from lmq.bench._client_common import (
    Progress,
    add_common_arguments,
    baseline_rows,
    create_topic,
    median_of,
    ratio,
    report,
    run_on_server,
)
from lmq.bench._cpp_load import CppLoadError, cpp_consume, options_refused

KINDS = ("push", "lite")


def add_arguments(parser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--kind", choices=KINDS, default="push",
                        help="push consumer (listener) or poll-style LitePullConsumer")
    parser.add_argument("-m", "--messages", type=int, default=20000, help="messages to read")
    parser.set_defaults(duration=30.0)


def run(args) -> int:
    if args.quick:
        args.messages, args.runs = min(args.messages, 1000), args.runs or 1
    args.runs = args.runs or 3
    if options_refused(args, "consume", ("messages", "tasks", "size", "runs", "duration"),
                       None if args.kind == "push" else
                       "--compare-cpp compares push consumers (--kind push)"):
        return 2
    result = run_on_server(_main, args)
    rows = [("consumer", f"{args.kind} ({args.tasks} tasks, {args.size} B bodies), "
                         f"median of {args.runs} run(s)"),
            ("messages", f"{result['messages']:,.0f} of {args.messages:,} in {result['seconds']:.2f} s"
                         f" (first after {_secs(result.get('first_msg_s'))})"),
            ("rate", f"{result['msgs_per_s']:,.0f} msgs/s, {result['mib_per_s']:.2f} MiB/s")]
    rows += baseline_rows(result, "PULL_MESSAGE")
    if result.get("cpp_msgs_per_s"):
        rows.append(("C++ client", f"{result['cpp_msgs_per_s']:,.0f} msgs/s, {result['cpp_messages']:,.0f}"
                                   f" in {result['cpp_seconds']:.2f} s (first after "
                                   f"{_secs(result.get('cpp_first_msg_s'))}; PushConsumer, "
                                   f"{args.tasks} threads, rocketmq wheel)"))
        rows.append(("vs C++", f"{result['ratio_vs_cpp']:.2f} x the C++ client (ours / C++)"))
    if result.get("cpp_error"):
        rows.append(("C++ client", f"failed: {result['cpp_error']}"))
    report(result, args.json, rows)
    return 0 if result["messages"] >= args.messages and not result.get("cpp_error") else 1


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


async def _main(args, namesrv: str) -> dict[str, Any]:
    from core.client import ClientInstance

    async with ClientInstance(namesrv_addr=namesrv, request_timeout=10) as client:
        topic = f"{args.topic}_{int(time.time())}"  # a fresh topic holds exactly our messages
        await create_topic(client, topic, args.queues)
        await _fill(client, topic, args)
        runs: list[dict[str, Any]] = []
        cpp_error = None
        for _ in range(args.runs):
            # Every consumer of every run is a fresh group reading the same messages from
            # offset 0 (a new group starts at 0 while the queue's min offset is 0, docs/protocol.md §5.3).
            one: dict[str, Any] = {}
            if not args.no_baseline:
                one["baseline_msgs_per_s"] = round(await _baseline(client, topic, args), 1)
            one.update(await _consume(client, topic, args))
            if args.compare_cpp and cpp_error is None:
                try:
                    cpp = await cpp_consume(namesrv, topic, args.messages, args.tasks, args.duration)
                except CppLoadError as exc:
                    cpp_error = str(exc)
                else:
                    one.update({"cpp_msgs_per_s": cpp["msgs_per_s"], "cpp_messages": cpp["messages"],
                                "cpp_seconds": cpp["seconds"], "cpp_first_msg_s": cpp["first_msg_s"]})
            runs.append(one)
    result: dict[str, Any] = {"kind": args.kind, "tasks": args.tasks, "size": args.size,
                              "topic": topic, "runs": args.runs}
    result.update(median_of(runs, ("messages", "seconds", "msgs_per_s", "mib_per_s", "first_msg_s",
                                    "baseline_msgs_per_s", "cpp_msgs_per_s", "cpp_messages",
                                    "cpp_seconds", "cpp_first_msg_s")))
    if result.get("baseline_msgs_per_s"):
        result["ratio"] = ratio(result["msgs_per_s"], result["baseline_msgs_per_s"])
    if args.compare_cpp:
        if "cpp_msgs_per_s" in result:
            result["ratio_vs_cpp"] = ratio(result["msgs_per_s"], result["cpp_msgs_per_s"])
            if result["cpp_messages"] < args.messages:
                cpp_error = cpp_error or (f"the C++ consumer read {result['cpp_messages']:,.0f} of "
                                          f"{args.messages:,} messages within {args.duration:g} s")
        if cpp_error:
            result["cpp_error"] = cpp_error
    result["per_run"] = {k: [r.get(k) for r in runs]
                         for k in ("msgs_per_s", "baseline_msgs_per_s", "cpp_msgs_per_s")
                         if any(r.get(k) is not None for r in runs)}
    return result


async def _fill(client, topic: str, args) -> None:
    from core.client import Message, Producer

    body = b"x" * args.size
    per_batch = max(1, min(256, (1 << 20) // (args.size + 64)))
    progress = Progress("filling", args.json)
    async with Producer(client, "BENCH_FILL", send_timeout=30) as producer:
        queues = await producer.fetch_publish_queues(topic)

        async def fill_queue(i: int, share: int) -> None:
            sent = 0
            while sent < share:
                n = min(per_batch, share - sent)
                await producer.send_batch([Message(topic, body) for _ in range(n)], mq=queues[i])
                sent += n
                progress.count += n

        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            async with trio.open_nursery() as senders:
                for i in range(len(queues)):
                    share = args.messages // len(queues) + (1 if i < args.messages % len(queues) else 0)
                    senders.start_soon(fill_queue, i, share)
            nursery.cancel_scope.cancel()
    progress.done()


async def _baseline(client, topic: str, args) -> float:
    from core.client.model import PullStatus, SubscriptionData
    from core.client.pull_consumer import pull_kernel

    sub = SubscriptionData.build(topic, "*")
    queues = client.routes[topic].subscribe_queues(topic)
    progress = Progress("baseline", args.json)
    start = time.monotonic()

    async def drain(mq) -> None:
        offset = 0
        while True:
            r = await pull_kernel(client, "BENCH_RAW", mq, sub, offset, 32, timeout=10)
            if r.status is not PullStatus.FOUND:
                return
            offset = r.next_begin_offset
            progress.count += len(r.messages)

    with trio.move_on_after(args.duration):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            async with trio.open_nursery() as pullers:
                for mq in queues:
                    pullers.start_soon(drain, mq)
            nursery.cancel_scope.cancel()
    progress.done()
    return progress.count / (time.monotonic() - start)


async def _consume(client, topic: str, args) -> dict[str, Any]:
    from core.client import LitePullConsumer, PushConsumer

    group = f"BENCH_CG_{time.monotonic_ns()}"
    progress = Progress(f"consume/{args.kind}", args.json)
    all_done = trio.Event()
    marks: dict[str, float] = {}

    def count(n: int) -> None:
        if n and not progress.count:
            marks["first"] = time.monotonic()
        progress.count += n
        if progress.count >= args.messages and not all_done.is_set():
            marks["last"] = time.monotonic()  # the consumer's shutdown is not consuming
            all_done.set()

    start = time.monotonic()
    with trio.move_on_after(args.duration):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            if args.kind == "push":
                async def listener(msgs, ctx) -> None:
                    count(len(msgs))

                consumer = PushConsumer(client, group, listener, consume_from_where="FIRST_OFFSET",
                                        consume_concurrency=args.tasks, consume_batch_size=32)
                consumer.subscribe(topic)
                async with consumer:
                    await all_done.wait()
            else:
                consumer = LitePullConsumer(client, group, consume_from_where="FIRST_OFFSET",
                                            pull_batch_size=32)
                consumer.subscribe(topic)
                async with consumer:
                    while not all_done.is_set():
                        count(len(await consumer.poll(timeout=1)))
            nursery.cancel_scope.cancel()
    elapsed = marks.get("last", time.monotonic()) - start
    progress.done()
    n = progress.count
    return {"messages": n, "seconds": round(elapsed, 3), "msgs_per_s": round(n / elapsed, 1),
            "mib_per_s": round(n * args.size / elapsed / (1 << 20), 3),
            "first_msg_s": round(marks["first"] - start, 3) if "first" in marks else None}
