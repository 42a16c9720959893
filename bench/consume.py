"""`lmq bench consume`: consume throughput of the native client's push or poll consumer.

The topic is first filled with ``--messages`` messages (batched sends). Baseline, measured
in the same run: raw PULL_MESSAGE loops over the same queues (one task per queue, 32
messages per pull, records decoded) — what the broker, the transport and decoding cost.
Then a fresh consumer group reads everything from the first offset with the chosen
consumer; its rate is printed as a ratio to the baseline (1.00 = the consumer's flow
control, dispatch, listener calls and offset bookkeeping cost nothing).

    lmq bench consume                              # push consumer, async listener
    lmq bench consume --kind lite --messages 50000 --json
"""

from __future__ import annotations

import time
from typing import Any

import trio

from bench._client_common import Progress, add_common_arguments, report, server_under_test

KINDS = ("push", "lite")


def add_arguments(parser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--kind", choices=KINDS, default="push",
                        help="push consumer (listener) or poll-style LitePullConsumer")
    parser.add_argument("-m", "--messages", type=int, default=20000, help="messages to read")
    parser.set_defaults(duration=30.0)


def run(args) -> int:
    if args.messages < 1 or args.tasks < 1 or args.size < 1 or args.duration <= 0:
        print("lmq bench consume: --messages, --tasks, --size and --duration must be positive")
        return 2
    with server_under_test(args.namesrv_addr) as ns:
        result = trio.run(_main, args, ns)
    rows = [("consumer", f"{args.kind} ({args.tasks} tasks, {args.size} B bodies)"),
            ("messages", f"{result['messages']:,} of {args.messages:,} in {result['seconds']:.2f} s"),
            ("rate", f"{result['msgs_per_s']:,.0f} msgs/s, {result['mib_per_s']:.2f} MiB/s")]
    if result.get("baseline_msgs_per_s"):
        rows.append(("baseline", f"{result['baseline_msgs_per_s']:,.0f} msgs/s (raw PULL_MESSAGE)"))
        rows.append(("ratio", f"{result['ratio']:.2f} x baseline"))
    report(result, args.json, rows)
    return 0 if result["messages"] >= args.messages else 1


async def _main(args, namesrv: str) -> dict[str, Any]:
    from core.client import AdminClient, ClientInstance

    async with ClientInstance(namesrv_addr=namesrv, request_timeout=10) as client:
        topic = f"{args.topic}_{int(time.time())}"  # a fresh topic holds exactly our messages
        await AdminClient(client).topic_create(topic, read_queue_nums=args.queues,
                                               write_queue_nums=args.queues)
        while await client.update_route(topic) is None:
            await trio.sleep(0.1)
        await _fill(client, topic, args)
        result: dict[str, Any] = {"kind": args.kind, "tasks": args.tasks, "size": args.size,
                                  "topic": topic}
        if not args.no_baseline:
            result["baseline_msgs_per_s"] = round(await _baseline(client, topic, args), 1)
        result.update(await _consume(client, topic, args))
        if result.get("baseline_msgs_per_s"):
            result["ratio"] = round(result["msgs_per_s"] / result["baseline_msgs_per_s"], 3)
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

    def count(n: int) -> None:
        progress.count += n
        if progress.count >= args.messages:
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
    elapsed = time.monotonic() - start
    progress.done()
    n = progress.count
    return {"messages": n, "seconds": round(elapsed, 3), "msgs_per_s": round(n / elapsed, 1),
            "mib_per_s": round(n * args.size / elapsed / (1 << 20), 3)}
