"""`lmq bench amqp`: AMQP 0-9-1 gateway throughput and queue memory, beside RabbitMQ
measured in the same run (`--compare-rabbitmq`).

Process layout (as `lmq bench mqtt`): the server under test is a child process pinned to
the server CPUs (``--pin auto``: the first allowed CPU) — ``lmq serve --no-mqtt
--amqp-port`` in a temporary data directory, and with ``--compare-rabbitmq`` a private
RabbitMQ node (its own epmd, node name, database; Debian's ``rabbitmq-server``). Every
load-generator process is pinned to the other CPUs (lmq/bench/_amqp_load.py: a raw client of
our own, frames pre-encoded with our codec, deliveries acknowledged with one `multiple`
ack per read; or pika's BlockingConnection). Rounds alternate the order of the servers;
every figure is the median over ``--runs`` rounds.

=============  ===========================================================================
single_raw     one queue, ``--size`` bodies: one raw publisher (confirms, at most
               ``--window`` unconfirmed) and one raw consumer (manual acks, prefetch
               ``--prefetch``); consumed/s
single_pika    the same with pika BlockingConnection: each publish waits for its confirm,
               one basic_ack per message
persistent     single_raw with delivery_mode 2 on a durable queue
fanout10/100   a topic exchange bound to 10 / 100 queues; one raw publisher, one raw
               consumer process with a channel per queue; deliveries/s (all queues)
queues10k      ``--declare-count`` queues declared (pipelined); resident memory of the
               server (its process tree) before and after, bytes per queue (lmq on a
               freshly started process; RabbitMQ as it is after the other phases)
=============  ===========================================================================

Beside each rate: the server's CPU seconds in the measured window (``srv_cpu_s``, its
process tree) and deliveries per server CPU-second (``consumed_per_srv_cpu_s``: on a shared
machine the server may not get its whole CPU), and the generator's busiest process. The backlog
(``published - consumed``) says when a consumer fell behind a publisher.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from typing import Any

from gateway.amqp.methods import ExchangeDelete, QueueDelete
from lmq.bench._amqp_load import RawClient, Sync, Window, declare, setup_fanout, worker
from lmq.bench._amqp_servers import (
    server_cpu_s,
    server_rss,
    start_lmq_amqp,
    start_rabbitmq,
    stop_tree,
)
from lmq.bench._args import add_pin_arguments, add_run_arguments
from lmq.bench._mqtt_open import pin_cpus

__all__ = ["PHASES", "add_arguments", "run", "run_phase"]

PHASES = ("single_raw", "single_pika", "persistent", "fanout10", "fanout100", "queues10k")
_JOIN_SLACK_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, quick="short smoke run", resolved_later=True)
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of: {', '.join(PHASES)}")
    parser.add_argument("--size", type=int, default=1024, help="body bytes (1024)")
    parser.add_argument("--window", type=int, default=1000,
                        help="raw publisher: most unconfirmed publishes (1000)")
    parser.add_argument("--prefetch", type=int, default=500, help="consumer prefetch (500)")
    parser.add_argument("--declare-count", type=int, default=None,
                        help="queues declared by queues10k (10000)")
    parser.add_argument("--compare-rabbitmq", action="store_true",
                        help="also measure a RabbitMQ node started here (if installed)")
    parser.add_argument("--rabbitmq-script", default=None,
                        help="rabbitmq-server start script (/usr/lib/rabbitmq/bin/rabbitmq-server)")
    add_pin_arguments(parser)


def _defaults(opts: argparse.Namespace) -> None:
    for name, full, short in (("duration", 5.0, 1.0), ("warmup", 1.0, 0.3), ("runs", 3, 1),
                              ("declare_count", 10_000, 200)):
        if getattr(opts, name) is None:
            setattr(opts, name, short if opts.quick else full)


def _spawn(ctx, cpus, jobs: list[tuple[str, tuple]], seconds: float,
           during=None) -> list[Window]:
    """Run worker processes (role, args) for about `seconds` and collect their windows;
    `during()` runs in this process meanwhile (it measures the server)."""
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(cpus, role, args, out), daemon=True)
             for role, args in jobs]
    for p in procs:
        p.start()
    if during is not None:
        during()
    results: list[Window] = []
    deadline = time.monotonic() + seconds + _JOIN_SLACK_S
    for _ in procs:
        results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return results


def _cleanup(server, queues: list[str], exchanges: list[str] = ()) -> None:
    c = RawClient(server.host, server.port)
    ch = c.channel()
    for q in queues:
        c.call(ch, QueueDelete(queue=q))
    for x in exchanges:
        c.call(ch, ExchangeDelete(exchange=x))
    c.close()


def run_phase(phase: str, server, opts: argparse.Namespace, gen_cpus: tuple[int, ...],
              ctx=None) -> dict[str, Any]:
    """One phase against one server: its figures (rates per second)."""
    ctx = ctx or mp.get_context("fork")
    host, port = server.host, server.port
    warm, dur = opts.warmup, opts.duration
    if phase == "queues10k":
        before = server_rss(server)
        [w] = _spawn(ctx, gen_cpus, [("declare_many", (host, port, "bench.k.",
                                                        opts.declare_count))], 120.0)
        if w.error:
            return {"error": w.error}
        time.sleep(1.0)
        after = server_rss(server)
        _cleanup(server, [f"bench.k.{i}" for i in range(opts.declare_count)])
        return {"queues": opts.declare_count, "rss_before_mib": round(before / 2**20, 1),
                "rss_after_mib": round(after / 2**20, 1),
                "bytes_per_queue": round((after - before) / opts.declare_count),
                "declares_per_s": round(opts.declare_count / max(w.extra["seconds"], 1e-9))}
    exchanges: list[str] = []
    if phase.startswith("fanout"):
        n = int(phase[len("fanout"):])
        queues = [f"bench.f{n}.{i}" for i in range(n)]
        exchange = f"bench.fan{n}"
        exchanges.append(exchange)
        c = RawClient(host, port)
        setup_fanout(c, c.channel(), exchange, queues)
        c.close()
        sync = Sync(ctx, 3)
        jobs = [("raw_consumer", (host, port, queues, opts.prefetch, sync, warm, dur)),
                ("raw_publisher", (host, port, exchange, "bench.x", opts.size, False,
                                   opts.window, n, sync, warm, dur))]
    else:
        durable = phase == "persistent"
        queues = [f"lmq.bench.{phase}"]
        c = RawClient(host, port)
        declare(c, c.channel(), queues[0], durable)
        c.close()
        sync = Sync(ctx, 3)
        if phase == "single_pika":
            jobs = [("pika_consumer", (host, port, queues[0], opts.prefetch, sync, warm, dur)),
                    ("pika_publisher", (host, port, queues[0], opts.size, opts.window, sync,
                                        warm, dur))]
        else:
            jobs = [("raw_consumer", (host, port, queues, opts.prefetch, sync, warm, dur)),
                    ("raw_publisher", (host, port, "", queues[0], opts.size, durable,
                                       opts.window, 1, sync, warm, dur))]
    cpu: list[float] = []

    def measure() -> None:
        """The server's CPU seconds over exactly the measured window."""
        t0 = sync.start()
        time.sleep(max(0.0, t0 + warm - time.monotonic()))
        cpu.append(server_cpu_s(server))
        time.sleep(max(0.0, t0 + warm + dur - time.monotonic()))
        cpu.append(server_cpu_s(server))

    windows = _spawn(ctx, gen_cpus, jobs, warm + dur + 60.0, measure)
    srv_cpu = cpu[1] - cpu[0] if len(cpu) == 2 else 0.0
    _cleanup(server, queues, exchanges)
    errors = [w.error for w in windows if w.error]
    if errors:
        return {"error": "; ".join(errors)}
    cons = [w for w in windows if "consumer" in w.role]
    pubs = [w for w in windows if "publisher" in w.role]
    consumed = sum(w.end - w.start for w in cons)
    published = sum(w.end - w.start for w in pubs)
    return {"consumed_per_s": round(consumed / dur), "confirmed_per_s": round(published / dur),
            "backlog": sum(w.total for w in pubs) * (len(queues) if phase.startswith("fanout")
                                                     else 1) - sum(w.total for w in cons),
            "srv_cpu_s": round(srv_cpu, 2),
            "consumed_per_srv_cpu_s": round(consumed / srv_cpu) if srv_cpu > 0 else None,
            "gen_max_cpu_pct": round(max(100 * w.cpu_s / dur for w in windows), 1)}


def _median(values: list[Any]) -> Any:
    nums = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(nums), 2) if nums else values[0]


def run(opts: argparse.Namespace) -> int:
    _defaults(opts)
    phases = [p for p in opts.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phases: {', '.join(sorted(unknown))}")
    srv_cpus, gen_cpus = pin_cpus(opts.pin, opts.server_cpus, opts.generator_cpus)
    tmp = tempfile.mkdtemp(prefix="lmq-bench-amqp-")
    servers = []
    extra = []
    notes: list[str] = []
    raw: dict[str, dict[str, list[dict]]] = {}
    try:
        servers.append(start_lmq_amqp(tmp, srv_cpus))
        if opts.compare_rabbitmq:
            started = start_rabbitmq(tmp, srv_cpus, opts.rabbitmq_script)
            if started is None:
                notes.append("RabbitMQ not installed: measured lmq only")
            else:
                servers.append(started[0])
                extra.append(started[1])
        ctx = mp.get_context("fork")
        for r in range(opts.runs):
            order = servers if r % 2 == 0 else list(reversed(servers))
            for server in order:
                for phase in phases:
                    if phase == "queues10k" and server.name == "lmq":
                        # A fresh process on fresh data: memory freed by earlier phases
                        # (or by replaying their declarations) would hide what the queues
                        # cost. RabbitMQ's VM is measured as it is.
                        i = servers.index(server)
                        stop_tree(server)
                        server = servers[i] = start_lmq_amqp(tempfile.mkdtemp(dir=tmp),
                                                             srv_cpus)
                    res = run_phase(phase, server, opts, gen_cpus, ctx)
                    raw.setdefault(server.name, {}).setdefault(phase, []).append(res)
    finally:
        for s in servers:
            stop_tree(s)
        for s in extra:
            stop_tree(s)
        shutil.rmtree(tmp, ignore_errors=True)
    results = {name: {ph: {k: _median([r.get(k) for r in runs]) for k in runs[0]}
                      for ph, runs in by_phase.items()} for name, by_phase in raw.items()}
    ratios = {}
    if "rabbitmq" in results:
        for ph in phases:
            ours, theirs = results["lmq"].get(ph, {}), results["rabbitmq"].get(ph, {})
            key = "bytes_per_queue" if ph == "queues10k" else "consumed_per_s"
            a, b = ours.get(key), theirs.get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                ratios[ph] = round(a / b, 2)
    report = {"results": results, "ratios": ratios, "notes": notes, "runs": opts.runs,
              "pinning": {"server": list(srv_cpus), "generator": list(gen_cpus)},
              "size": opts.size}
    if opts.json:
        print(json.dumps(report))
    else:
        _print(report, phases)
    return 1 if any("error" in f for r in results.values() for f in r.values()) else 0


def _print(report: dict, phases: list[str]) -> None:
    names = list(report["results"])
    print(f"medians over {report['runs']} round(s), {report['size']} B bodies; server CPUs "
          f"{report['pinning']['server'] or 'any'}, generator CPUs "
          f"{report['pinning']['generator'] or 'any'}")
    for ph in phases:
        for name in names:
            figures = report["results"][name].get(ph, {})
            text = "  ".join(f"{k}={v}" for k, v in figures.items())
            print(f"{ph:<12} {name:<9} {text}")
        if ph in report["ratios"]:
            what = "bytes/queue" if ph == "queues10k" else "consumed/s"
            print(f"{ph:<12} ratio     lmq/rabbitmq {what} = {report['ratios'][ph]}")
    for note in report["notes"]:
        print(f"note: {note}")
