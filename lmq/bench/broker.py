"""`lmq bench broker`: the broker's send, batch, pull and latency figures over TCP, each
as a ratio to the transport ceiling measured in the same run.

Process layout: the load generator is this process (one trio program); every server it
measures runs in a child process of its own, so each side has its own interpreter and,
on a 2-core machine, its own core:

* ``lmq serve`` (name server + broker) on free loopback ports, in a temporary data
  directory — or the broker given by ``--target host:port``;
* ``bench._broker_echo --mode remoting``: our RemotingServer answering every request at
  once. Its round trips per second are **the baseline**: every figure is printed as
  ``figure / baseline``, i.e. how the broker compares with a server that does nothing
  but the remoting layer (docs/architecture.md §6);
* ``bench._broker_echo --mode raw``: canned answers without the remoting layer; what the
  generator reaches against it is the generator's own ceiling (it must sit well above
  everything else, or the generator would be what is measured).

Phases (each run does all of them; the report gives the median of ``--runs``):

===========  ==========================================================================
gen_ceiling  generator against the raw server (single-send frames, 64 in flight)
echo_tcp     BASELINE: generator against the remoting echo server, same frames
echo_latency sync sends at ``--rate`` per second to the echo server (open loop)
echo_local   64 tasks invoking the echo table through the in-process transport
send         SEND_MESSAGE_V2, 256 B bodies, 64 in flight            (messages/s)
batch        SEND_BATCH_MESSAGE, 32 messages per request             (messages/s)
pull         PULL_MESSAGE, maxMsgNums 32, over what send/batch wrote (messages/s)
latency      sync sends at ``--rate`` per second, latency from each send's due time
local_send   64 tasks sending through the in-process transport to a broker running in
             this process (register_local): the same broker without the TCP transport
===========  ==========================================================================

Latency ratios are to the echo server's latency at the same rate. Each throughput line
also shows the CPU used by generator and server (1.00 = one core) and the figure per
second of server CPU, which stays meaningful when other processes share the cores. With
``--profile DIR`` the broker is sampled by py-spy during its phases of the first run and
the hot spots are printed (raw stacks in DIR).

Everything talks to 127.0.0.1 only (unless ``--target`` says otherwise) and each phase is
bounded by ``--warmup`` + ``--duration`` (plus at most 10 s of draining).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from core.remoting.client import RemotingClient, parse_addr
from core.remoting.codec import RemotingCommand
from core.remoting.errors import RemotingError
from lmq.bench import _broker_workload as wl
from lmq.bench._args import add_run_arguments
from lmq.bench._broker_echo import echo_table
from lmq.bench._broker_loadgen import (
    Latency,
    Throughput,
    closed_loop,
    encode_frames,
    invoke_loop,
    paced_latency,
)
from lmq.bench._broker_procs import Child, free_port, listening_pid
from lmq.bench._broker_profile import HotSpots, Profiler
from lmq.bench._broker_report import BASELINE, PHASES, build_report, print_table

__all__ = ["PHASES", "add_arguments", "main", "run"]

_BROKER_PHASES = ("send", "batch", "pull", "latency")

_START_TIMEOUT_S = 60.0
_SEND_POOL = 4096
_BATCH_POOL = 256
_PULL_POOL = 20_000


# ------------------------------------------------------------------------ the run
@dataclass
class _Ctx:
    opts: argparse.Namespace
    tmp: str
    client: RemotingClient
    raw_port: int | None = None
    raw_pid: int | None = None
    echo_port: int | None = None
    echo_pid: int | None = None
    broker_addr: str | None = None
    broker_pid: int | None = None
    broker_error: str | None = None
    send_cmds: list[RemotingCommand] = field(default_factory=list)
    send_frames: list[bytes] = field(default_factory=list)
    batch_frames: list[bytes] = field(default_factory=list)
    run_index: int = 0
    profiles: dict[str, HotSpots] = field(default_factory=dict)
    profile_errors: dict[str, str] = field(default_factory=dict)


def _throughput(t: Throughput) -> dict[str, Any]:
    if t.errors and not t.requests:
        raise RuntimeError(f"every request failed: {t.first_error}")
    return {
        "value": t.messages_per_s,
        "requests_per_s": t.requests_per_s,
        "errors": t.errors,
        "first_error": t.first_error,
        "client_cpu": t.client_cpu,
        "server_cpu": t.server_cpu,
        # Figure per second of server CPU: steadier than the figure itself when other
        # processes take the server's core (the machine is shared).
        "per_server_cpu_s": t.messages / (t.server_cpu * t.seconds) if t.server_cpu else None,
    }


def _latency(lat: Latency) -> dict[str, Any]:
    if not lat.samples:
        raise RuntimeError(f"no latency samples (errors {lat.errors}): {lat.first_error}")
    out: dict[str, Any] = {f"{k}_ms": v for k, v in lat.from_due_ms.items()}
    out.update({f"write_{k}_ms": v for k, v in lat.from_write_ms.items()})
    out.update(samples=lat.samples, errors=lat.errors, lost=lat.lost,
               first_error=lat.first_error)
    return out


async def _closed(ctx: _Ctx, port: int, frames: list[bytes], window: int,
                  per_response: int | None, pid: int | None, host: str = "127.0.0.1"
                  ) -> dict[str, Any]:
    o = ctx.opts
    return _throughput(await closed_loop(
        host, port, frames, window=window, connections=o.connections, warmup=o.warmup,
        duration=o.duration, per_response=per_response, server_pid=pid))


async def _paced(ctx: _Ctx, host: str, port: int) -> dict[str, Any]:
    o = ctx.opts
    lat = await trio.to_thread.run_sync(
        lambda: paced_latency(host, port, ctx.send_frames, rate=o.rate, warmup=o.warmup,
                              duration=o.duration))
    return _latency(lat)


def _broker_hostport(ctx: _Ctx) -> tuple[str, int]:
    if ctx.broker_addr is None:
        raise RuntimeError(f"broker unavailable: {ctx.broker_error}")
    return parse_addr(ctx.broker_addr)


async def phase_gen_ceiling(ctx: _Ctx) -> dict[str, Any]:
    return await _closed(ctx, ctx.raw_port, ctx.send_frames, ctx.opts.inflight, 1,
                         ctx.raw_pid)


async def phase_echo_tcp(ctx: _Ctx) -> dict[str, Any]:
    return await _closed(ctx, ctx.echo_port, ctx.send_frames, ctx.opts.inflight, 1,
                         ctx.echo_pid)


async def phase_echo_latency(ctx: _Ctx) -> dict[str, Any]:
    return await _paced(ctx, "127.0.0.1", ctx.echo_port)


async def _local_sends(ctx: _Ctx, client: RemotingClient, addr: str) -> dict[str, Any]:
    cmds = ctx.send_cmds
    n = len(cmds)

    def make(i: int) -> RemotingCommand:
        c = cmds[i % n]  # pre-built ext dict and body, a fresh command (opaque is per call)
        return RemotingCommand(c.code, ext_fields=c.ext_fields, body=c.body)

    o = ctx.opts
    return _throughput(await invoke_loop(client, addr, make, concurrency=o.inflight,
                                         warmup=o.warmup, duration=o.duration))


async def phase_echo_local(ctx: _Ctx) -> dict[str, Any]:
    async with RemotingClient(request_timeout=10.0) as client:
        client.register_local("127.0.0.1:1", echo_table())
        return await _local_sends(ctx, client, "127.0.0.1:1")


async def phase_send(ctx: _Ctx) -> dict[str, Any]:
    host, port = _broker_hostport(ctx)
    return await _closed(ctx, port, ctx.send_frames, ctx.opts.inflight, 1, ctx.broker_pid,
                         host)


async def phase_batch(ctx: _Ctx) -> dict[str, Any]:
    host, port = _broker_hostport(ctx)
    return await _closed(ctx, port, ctx.batch_frames, ctx.opts.batch_inflight,
                         ctx.opts.batch, ctx.broker_pid, host)


async def phase_pull(ctx: _Ctx) -> dict[str, Any]:
    host, port = _broker_hostport(ctx)
    o = ctx.opts
    ranges = await wl.queue_ranges(ctx.client, ctx.broker_addr)
    if min(high - low for low, high in ranges.values()) < o.pull * 4:
        # Nothing written yet (phases skipped): a few batches per queue to read back.
        fill = wl.batch_commands(wl.QUEUES * 4 * max(1, o.pull // o.batch + 1), o.batch,
                                 o.size)
        for cmd in fill:
            resp = await ctx.client.invoke(ctx.broker_addr, cmd)
            if resp.code != 0:
                raise RuntimeError(f"filling the topic failed: {resp.code} {resp.remark}")
        ranges = await wl.queue_ranges(ctx.client, ctx.broker_addr)
    frames = encode_frames(wl.pull_commands(ranges, o.pull, _PULL_POOL))
    return await _closed(ctx, port, frames, o.pull_inflight, None, ctx.broker_pid, host)


async def phase_latency(ctx: _Ctx) -> dict[str, Any]:
    host, port = _broker_hostport(ctx)
    return await _paced(ctx, host, port)


async def phase_local_send(ctx: _Ctx) -> dict[str, Any]:
    from core.broker.config import BrokerConfig
    from core.broker.controller import BrokerController

    data_dir = os.path.join(ctx.tmp, f"local-{ctx.run_index}")
    extra = {"commitlog_file_size": ctx.opts.commitlog_mb << 20} if ctx.opts.commitlog_mb else {}
    broker = BrokerController(BrokerConfig(
        host="127.0.0.1", port=0, data_dir=data_dir, flush=ctx.opts.flush, **extra))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve)
        try:
            async with RemotingClient(request_timeout=10.0) as client:
                client.register_local(broker.broker_addr, broker.table)
                await wl.create_topic(client, broker.broker_addr)
                return await _local_sends(ctx, client, broker.broker_addr)
        finally:
            broker.stop()


_PHASE_FUNCS: dict[str, Callable[[_Ctx], Awaitable[dict[str, Any]]]] = {
    "gen_ceiling": phase_gen_ceiling,
    "echo_tcp": phase_echo_tcp,
    "echo_latency": phase_echo_latency,
    "echo_local": phase_echo_local,
    "send": phase_send,
    "batch": phase_batch,
    "pull": phase_pull,
    "latency": phase_latency,
    "local_send": phase_local_send,
}


async def _start_broker(ctx: _Ctx, children: list[Child]) -> None:
    o = ctx.opts
    if o.target:
        ctx.broker_addr = o.target
        ctx.broker_pid = listening_pid(parse_addr(o.target)[1])
    else:
        ns_port, broker_port = free_port(), free_port()
        argv = [sys.executable, "-m", "lmq", "serve", "--no-grpc", "--data-dir",
                os.path.join(ctx.tmp, "broker"), "--host", "127.0.0.1",
                "--namesrv-port", str(ns_port), "--broker-port", str(broker_port),
                "--flush", o.flush, "--log-level", "WARNING"]
        if o.commitlog_mb:
            config = os.path.join(ctx.tmp, "broker.toml")
            with open(config, "w", encoding="utf-8") as fh:
                fh.write(f"commitlog_file_size = {o.commitlog_mb << 20}\n")
            argv += ["--config", config]
        child = Child(argv, os.path.join(ctx.tmp, "broker.log"), port_line=False)
        children.append(child)
        ctx.broker_addr = f"127.0.0.1:{broker_port}"
        ctx.broker_pid = child.pid
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            await wl.create_topic(ctx.client, ctx.broker_addr)
            return
        except (RemotingError, OSError) as exc:
            if not o.target and children[-1].proc.poll() is not None:
                raise RuntimeError(
                    f"lmq serve exited; last log line: {children[-1].last_log_line()}"
                    f" (log in {children[-1].log_path}, see --keep-data)") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker at {ctx.broker_addr} not ready: {exc!r}") from None
            await trio.sleep(0.2)


async def _bench(opts: argparse.Namespace, phases: list[str]) -> dict[str, Any]:
    load_start = list(os.getloadavg())
    tmp = tempfile.mkdtemp(prefix="lmq-bench-broker-")
    children: list[Child] = []
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in phases}
    failures: dict[str, str] = {}
    try:
        async with RemotingClient(request_timeout=10.0) as client:
            ctx = _Ctx(opts, tmp, client)
            for mode in ("raw", "remoting"):
                child = Child([sys.executable, "-m", "lmq.bench._broker_echo", "--mode", mode],
                              os.path.join(tmp, f"echo-{mode}.log"), port_line=True)
                children.append(child)
                port = await trio.to_thread.run_sync(child.read_port, _START_TIMEOUT_S)
                if mode == "raw":
                    ctx.raw_port, ctx.raw_pid = port, child.pid
                else:
                    ctx.echo_port, ctx.echo_pid = port, child.pid
            if any(p in _BROKER_PHASES for p in phases):
                try:
                    await _start_broker(ctx, children)
                except Exception as exc:  # reported per phase, the baselines still run
                    ctx.broker_addr, ctx.broker_error = None, str(exc)
            ctx.send_cmds = wl.send_commands(_SEND_POOL, opts.size)
            ctx.send_frames = encode_frames(ctx.send_cmds)
            ctx.batch_frames = encode_frames(
                wl.batch_commands(_BATCH_POOL, opts.batch, opts.size))
            for run_index in range(opts.runs):
                ctx.run_index = run_index
                for phase in phases:
                    if phase in failures:
                        continue
                    results[phase].append(await _run_phase(ctx, phase, failures))
            profiles = {k: asdict(v) for k, v in ctx.profiles.items()}
            profile_errors = dict(ctx.profile_errors)
    finally:
        with trio.CancelScope(shield=True):  # also on SIGTERM / Ctrl-C: stop the servers
            for child in reversed(children):
                await trio.to_thread.run_sync(child.stop)
        if opts.keep_data:
            print(f"data kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report = build_report(opts, phases, results, failures, profiles, profile_errors)
    # The machine is shared: a high load average explains a noisy run.
    report["machine"] = {"cpus": os.cpu_count(), "loadavg_start": load_start,
                         "loadavg_end": list(os.getloadavg())}
    return report


async def _bench_until_signal(opts: argparse.Namespace, phases: list[str]
                              ) -> dict[str, Any] | None:
    """`_bench`, cancelled cleanly (children stopped, data removed) by SIGTERM / SIGHUP."""
    report = None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            report = await _bench(opts, phases)
            nursery.cancel_scope.cancel()
    return report


async def _run_phase(ctx: _Ctx, phase: str, failures: dict[str, str]) -> dict[str, Any]:
    o = ctx.opts
    profiler = None
    if o.profile and phase in _BROKER_PHASES and ctx.broker_pid and ctx.run_index == 0:
        os.makedirs(o.profile, exist_ok=True)
        profiler = Profiler(ctx.broker_pid, o.warmup + o.duration,
                            os.path.join(o.profile, f"{phase}.txt"))
        profiler.start()
    try:
        with trio.fail_after(o.warmup + o.duration + 60):
            result = await _PHASE_FUNCS[phase](ctx)
    except Exception as exc:
        while isinstance(exc, ExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]  # the first real failure, not trio's wrapper
        failures[phase] = f"{type(exc).__name__}: {exc}"
        result = {}
    if profiler is not None:
        spots = await trio.to_thread.run_sync(profiler.finish)
        if spots is not None:
            ctx.profiles[phase] = spots
        elif profiler.error:
            ctx.profile_errors[phase] = profiler.error
    return result


# ------------------------------------------------------------------------ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `lmq bench broker`."""
    parser.add_argument("--target", metavar="HOST:PORT",
                        help="measure this running broker instead of starting `lmq serve`")
    add_run_arguments(parser, quick="tiny sizes for a smoke test (1 run, 0.5 s phases)")
    parser.add_argument("--inflight", type=int, default=64,
                        help="single sends in flight (default %(default)s)")
    parser.add_argument("--connections", type=int, default=4,
                        help="TCP connections the in-flight requests share (default %(default)s)")
    parser.add_argument("--size", type=int, default=256, help="body bytes (default %(default)s)")
    parser.add_argument("--batch", type=int, default=32,
                        help="messages per batch send (default %(default)s)")
    parser.add_argument("--batch-inflight", type=int, default=16,
                        help="batch sends in flight (default %(default)s)")
    parser.add_argument("--pull", type=int, default=32,
                        help="maxMsgNums of each pull (default %(default)s)")
    parser.add_argument("--pull-inflight", type=int, default=16,
                        help="pulls in flight (default %(default)s)")
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="sends per second of the latency phases (default %(default)s)")
    parser.add_argument("--flush", choices=("async", "sync"), default="async",
                        help="broker flush mode (default %(default)s)")
    parser.add_argument("--commitlog-mb", type=int, default=None,
                        help="CommitLog file size of the brokers started by the bench "
                        "(default: the broker's, 1024; --quick: 64)")
    parser.add_argument("--only", metavar="PHASE,...",
                        help=f"run only these phases ({', '.join(PHASES)})")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy the broker during its phases (first run) into DIR")
    parser.add_argument("--replicated", action="store_true",
                        help="instead of the phases: send, batch and p99 of ASYNC_MASTER "
                        "without slave, with a slave, and SYNC_MASTER with a slave (docs/ha.md)")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the temporary data directory")


def _phases(opts: argparse.Namespace) -> list[str]:
    if not opts.only:
        return list(PHASES)
    wanted = [p.strip() for p in opts.only.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase(s): {', '.join(unknown)}")
    if BASELINE not in wanted:
        wanted.append(BASELINE)  # every figure is a ratio to it
    return [p for p in PHASES if p in wanted]


def run(args: argparse.Namespace) -> int:
    """Run the bench with parsed `args`; prints the table (or JSON). Exit code 0 unless a
    phase failed."""
    if args.quick:
        args.runs, args.duration, args.warmup = 1, 0.5, 0.2
        args.commitlog_mb = args.commitlog_mb or 64
    if args.runs < 1 or args.duration <= 0 or args.warmup < 0 or args.rate <= 0:
        print("--runs >= 1, --duration > 0, --warmup >= 0 and --rate > 0 please",
              file=sys.stderr)
        return 2
    if getattr(args, "replicated", False):
        from lmq.bench._broker_replicated import print_replicated, run_replicated

        report = trio.run(run_replicated, args)
        if args.json:
            print(json.dumps(report))
        else:
            print_replicated(report)
        return 1 if any("error" in c for c in report["replicated"].values()) else 0
    try:
        phases = _phases(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    report = trio.run(_bench_until_signal, args, phases)
    if report is None:
        print("interrupted", file=sys.stderr)
        return 143
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 1 if any("error" in e for e in report["phases"].values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmq bench broker",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
