"""`lmq bench mqtt`: MQTT gateway throughput, latency and connection cost, beside
Mosquitto measured in the same run.

Process layout (2 cores are enough; every role has its own interpreter):

* the server under test in a child process: ``lmq serve --mqtt-port`` on free loopback
  ports in a temporary data directory, or the broker given by ``--target host:port``;
* with ``--compare-mosquitto``, a ``mosquitto`` child process (minimal config: one
  loopback listener, anonymous, large queues, no persistence) measured with the same
  loads in the same run, run by run interleaved with ours; figures are printed as
  ratios ours / mosquitto;
* the load generator: worker processes forked per phase (lmq/bench/_mqtt_loadgen.py: raw MQTT
  3.1.1, PUBLISHes pre-encoded with our codec, received bytes scanned, not decoded);
* lmq/bench/_mqtt_sink.py, a server that does nothing but answer: what the generator reaches
  against it (``gen_ceiling_*``) is the generator's own ceiling, the upper bound of any
  figure below.

Phases (median of ``--runs``; throughput = messages the subscribers received per second,
publishers held back by an end-to-end window so that no phase measures a backlog):

=================  ===================================================================
gen_ceiling_pub    publishers (QoS 0) against the sink                   (messages/s)
gen_ceiling_sub    one subscriber reading the sink's firehose             (messages/s)
fanin_qos0/1       ``--publishers`` publishers, one subscriber on a ``+`` wildcard
fanout10_qos0/1    one publisher, 10 subscribers (deliveries/s)
fanout100_qos0/1   one publisher, 100 subscribers (deliveries/s)
latency            one publisher at ``--rate``/s (QoS ``--latency-qos``), one
                   subscriber; end-to-end latency from each message's due time
idle               ``--idle-connections`` connected clients doing nothing: resident
                   memory of the server process per connection (psutil), on a freshly
                   restarted server process (not possible with ``--target``)
=================  ===================================================================

Open-loop phases (lmq/bench/_mqtt_open.py: publishers paced by a schedule or not at all,
never by the subscribers): ``devices1000``, ``devices2000`` (any ``devices<N>``),
``steps``, ``unpaced_fanin_qos0``, ``unpaced_fanin_qos1``, ``unpaced_fanout100``; they
report delivered/s during the window, loss after the drain, latency percentiles from each
message's due time, the share delivered within 1 s and the highest sustained rate.

Honest figures: with ``--pin auto`` (the default, on a machine with 2 or more CPUs) the
server runs on the first allowed CPU and every generator process on the others; each
phase reports deliveries per server CPU-second beside deliveries per second and the
generator's CPU (a note flags a generator process above 80 % of a core); rounds alternate
the order of the servers and every figure is the median over the rounds.

Everything is on 127.0.0.1 (unless ``--target`` says otherwise) and each phase is
bounded by ``--warmup`` + ``--duration`` + ``--drain`` plus a few seconds of set-up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from lmq.bench import _mqtt_gateways
from lmq.bench._args import add_pin_arguments, add_run_arguments
from lmq.bench._mqtt_loadgen import EXIT, GO, STOP, WAIT, Job, worker_main
from lmq.bench._mqtt_open import (
    OPEN_PHASES,
    is_open_phase,
    open_result,
    pin_cpus,
    run_open_phase,
)
from lmq.bench._mqtt_ping import Pinger
from lmq.bench._mqtt_report import CEILINGS, median_of, notes_for, primary, print_table, ratios
from lmq.bench._mqtt_servers import (
    MqttServer,
    start_lmq,
    start_mosquitto,
    target_server,
    tree_cpu_s,
)
from lmq.bench._mqtt_sink import sink_main

__all__ = ["PHASES", "add_arguments", "options", "run", "run_phase"]

PHASES = ("gen_ceiling_pub", "gen_ceiling_sub", "fanin_qos0", "fanin_qos1",
          "fanout10_qos0", "fanout10_qos1", "fanout100_qos0", "fanout100_qos1",
          "latency", "idle", *OPEN_PHASES)
_READY_TIMEOUT_S = 120.0
_STALL_S = 1.0
_RSS_SAMPLE_S = 0.2  # anonymous memory sampled this often during a window
_SUBS_PER_PROC = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, quick="short smoke run: 1 run, short phases, few connections",
                      resolved_later=True)
    parser.add_argument("--drain", type=float, default=None,
                        help="at most this many seconds after a phase for messages in flight "
                             "to arrive (5); what is still missing is reported")
    parser.add_argument("--target", metavar="HOST:PORT",
                        help="measure this MQTT broker instead of starting `lmq serve`")
    parser.add_argument("--compare-mosquitto", action="store_true",
                        help="also measure a mosquitto started here (if installed); print ratios")
    parser.add_argument("--mosquitto-bin", default=None, help="mosquitto executable")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of: {', '.join(PHASES)}")
    parser.add_argument("--size", type=int, default=64, help="payload bytes (64)")
    parser.add_argument("--publishers", type=int, default=None, help="fan-in publishers (16)")
    parser.add_argument("--pub-procs", type=int, default=1, help="fan-in publisher processes (1)")
    parser.add_argument("--window", type=int, default=2000,
                        help="end-to-end window: messages published but not yet received (2000)")
    parser.add_argument("--rate", type=float, default=None, help="latency phase messages/s (1000)")
    parser.add_argument("--latency-qos", type=int, choices=(0, 1), default=1)
    parser.add_argument("--idle-connections", type=int, default=None, help="idle phase (10000)")
    g = parser.add_argument_group("open-loop phases (devices<N>, steps, unpaced_*)")
    g.add_argument("--device-rate", type=float, default=10.0,
                   help="messages/s of each device in devices<N> (10)")
    g.add_argument("--devices-per-proc", type=int, default=500,
                   help="device connections per generator process (500)")
    g.add_argument("--open-size", type=int, default=256,
                   help="payload bytes of devices, steps and unpaced fan-in (256)")
    g.add_argument("--open-publishers", type=int, default=4,
                   help="publishers of steps and unpaced fan-in (4)")
    g.add_argument("--step-rates", default=None,
                   help="total msg/s of the steps phase, rising (2000,5000,10000,20000,40000)")
    add_pin_arguments(parser)
    _mqtt_gateways.add_arguments(parser)


def _defaults(opts: argparse.Namespace) -> None:
    quick = opts.quick
    for name, full, short in (("duration", 5.0, 0.6), ("warmup", 1.0, 0.2), ("runs", 3, 1),
                              ("drain", 5.0, 2.0),
                              ("publishers", 16, 4), ("rate", 1000.0, 200.0),
                              ("idle_connections", 10_000, 200)):
        if getattr(opts, name) is None:
            setattr(opts, name, short if quick else full)
    if opts.step_rates is None:
        opts.step_rates = "1000,2000,5000" if quick else "2000,5000,10000,20000,40000"
    if isinstance(opts.step_rates, str):
        opts.step_rates = [float(x) for x in opts.step_rates.split(",") if x.strip()]
    opts.server_cpu_set, opts.generator_cpu_set = pin_cpus(
        opts.pin, opts.server_cpus, opts.generator_cpus)


# ------------------------------------------------------------------------ one phase
@dataclass
class _Shared:
    ctx: Any
    counters: Any
    ctl: Any
    results: Any
    times: Any  # the measured window [start, end], monotonic clock
    procs: list = field(default_factory=list)


def _shared() -> _Shared:
    ctx = mp.get_context("fork")
    return _Shared(ctx, ctx.RawArray("q", 256), ctx.RawArray("i", 4), ctx.Queue(),
                   ctx.RawArray("d", 2))


def _spawn(sh: _Shared, jobs: list[Job], timeout: float = _READY_TIMEOUT_S) -> dict[str, int]:
    """Start one process per job; wait until each reports its connections are up."""
    names = {j.name for j in jobs}
    for job in jobs:
        p = sh.ctx.Process(target=worker_main,
                           args=(job, sh.counters, sh.ctl, sh.results, sh.times), daemon=True)
        p.start()
        sh.procs.append(p)
    ready: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while names - set(ready):
        try:
            msg = sh.results.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - queue.Empty
            raise RuntimeError(f"workers not ready: {sorted(names - set(ready))}") from None
        if msg[0] == "ready":
            ready[msg[1]] = msg[2]
        elif msg[0] == "error":
            raise RuntimeError(f"worker {msg[1]} failed: {msg[2]}")
    return ready


def _finish(sh: _Shared) -> list[tuple]:
    """EXIT every worker, collect what they report, reap them."""
    sh.ctl[0] = EXIT
    out = []
    deadline = time.monotonic() + 15
    alive = list(sh.procs)
    while alive and time.monotonic() < deadline:
        try:
            out.append(sh.results.get(timeout=0.1))
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
        alive = [p for p in alive if p.is_alive()]
    for p in sh.procs:
        if p.is_alive():
            p.terminate()
        p.join(5)
    while True:
        try:
            out.append(sh.results.get_nowait())
        except Exception:  # noqa: BLE001 - queue.Empty
            break
    sh.procs.clear()
    return out


def _procs_cpu(procs: list) -> dict[int, float]:
    return {p.pid: tree_cpu_s(p.pid) for p in procs}


def _sum(counters, slots) -> int:
    return sum(counters[s] for s in slots)


def _load_phase(opts, host: str, port: int, pid: int | None, jobs_sub: list[Job],
                jobs_pub: list[Job], fanout: int) -> dict[str, Any]:
    """Run publishers and subscribers: GO, warm up, measure, STOP, drain."""
    sh = _shared()
    _mqtt_gateways.place_subscribers(opts, port, jobs_sub)
    pub_slots = tuple(j.slot for j in jobs_pub)
    sub_slots = tuple(j.slot for j in jobs_sub)
    for j in jobs_pub + jobs_sub:
        j.pub_slots, j.sub_slots, j.fanout = pub_slots, sub_slots, fanout
        j.cpus = getattr(opts, "generator_cpu_set", ())
    pinger = None
    try:
        sh.ctl[0] = WAIT
        if jobs_sub:
            _spawn(sh, jobs_sub)
        _spawn(sh, jobs_pub)
        sh.ctl[0] = GO
        pinger = Pinger(host, port, getattr(opts, "generator_cpu_set", ()))
        time.sleep(opts.warmup)
        pinger.start()
        s1 = (_sum(sh.counters, pub_slots), _sum(sh.counters, sub_slots), time.monotonic(),
              tree_cpu_s(pid), _procs_cpu(sh.procs))
        sh.times[0] = s1[2]
        sh.ctl[1] = 1
        peak_anon = _sleep_sampling(pid, opts.duration)
        sh.ctl[1] = 0
        pinger.stop()
        pinging = pinger.figures()
        s2 = (_sum(sh.counters, pub_slots), _sum(sh.counters, sub_slots), time.monotonic(),
              tree_cpu_s(pid), _procs_cpu(sh.procs))
        sh.times[1] = s2[2]
        rss_end = _rss(pid)  # the server's memory at the end of the window (overload bound)
        anon_end = _anon(pid)
        sh.ctl[0] = STOP
        # Let what is in flight arrive: until all did, nothing came for a while, or
        # --drain seconds passed (what is still missing then is reported as such).
        last, since, deadline = -1, time.monotonic(), time.monotonic() + opts.drain
        while time.monotonic() < deadline:
            got = _sum(sh.counters, sub_slots)
            if got >= _sum(sh.counters, pub_slots) * fanout:
                break
            if got != last:
                last, since = got, time.monotonic()
            elif time.monotonic() - since > max(_STALL_S, opts.drain / 4):
                break
            time.sleep(0.1)
        sent, received = _sum(sh.counters, pub_slots), _sum(sh.counters, sub_slots)
    finally:
        if pinger is not None:
            pinger.stop()
        reports = _finish(sh)
    errors = [r for r in reports if r[0] == "error"]
    if errors:
        raise RuntimeError(f"worker {errors[0][1]} failed: {errors[0][2]}")
    dt = s2[2] - s1[2]
    gen = {p: s2[4][p] - s1[4].get(p, 0.0) for p in s2[4]}
    delivered = (s2[1] - s1[1]) / dt
    server_cpu = (s2[3] - s1[3]) / dt
    result = {
        "published_per_s": round((s2[0] - s1[0]) / dt, 1),
        "delivered_per_s": round(delivered, 1),
        "server_cpu_pct": round(100 * server_cpu, 1),
        # Deliveries per second of server CPU: the figure pinning cannot flatter.
        "per_server_cpu_s": round(delivered / server_cpu, 1) if server_cpu > 0 else None,
        "generator_cpu_pct": round(100 * sum(gen.values()) / dt, 1),
        "generator_max_proc_cpu_pct": round(100 * max(gen.values(), default=0.0) / dt, 1),
        # Deliveries still missing after the drain (QoS 0: dropped; QoS 1: in flight).
        "missing": max(0, sent * fanout - received) if fanout else 0,
    }
    result.update(pinging)
    if rss_end is not None:
        result["server_rss_mb"] = round(rss_end / 2**20, 1)
    if anon_end is not None:
        # Anonymous memory (RSS less file-backed pages such as the mapped CommitLog): what
        # the server holds itself; the overload bound is about this one.
        result["server_anon_mb"] = round(anon_end / 2**20, 1)
        result["server_anon_peak_mb"] = round(max(peak_anon, anon_end) / 2**20, 1)
    open_result(result, reports, sent, fanout)
    stamps = [s for r in reports if r[0] == "latency" for s in r[2]]
    if stamps:
        stamps.sort()
        result.update(samples=len(stamps), p50_ms=_pct(stamps, 50), p99_ms=_pct(stamps, 99),
                      max_ms=round(stamps[-1] * 1000, 3))
    return result


def _pct(sorted_s: list[float], p: float) -> float:
    k = min(len(sorted_s) - 1, max(0, round(p / 100 * (len(sorted_s) - 1))))
    return round(sorted_s[k] * 1000, 3)


def _slot_jobs(role: str, n_conns: int, per_proc: int, first_slot: int, prefix_base: str,
               **kw: Any) -> list[Job]:
    """`n_conns` connections of one role spread over processes of `per_proc` each."""
    jobs = []
    slot = first_slot
    left = n_conns
    while left > 0:
        take = min(per_proc, left)
        jobs.append(Job(name=f"{role}{slot}", role=role, slot=slot, conns=take,
                        client_prefix=f"{prefix_base}-{role}{slot}", **kw))
        slot += 1
        left -= take
    return jobs


def run_phase(phase: str, opts, server: MqttServer, tag: str) -> dict[str, Any]:
    """One measurement of `phase` against `server` (tag keeps topics of runs apart)."""
    host, port, pid = server.host, server.port, server.pid
    base = f"bench/{tag}/{phase}"
    common = dict(host=host, port=port, size=opts.size)
    if phase == "gen_ceiling_pub":
        pubs = _slot_jobs("pub", opts.publishers, -(-opts.publishers // opts.pub_procs), 0,
                          topics=[f"{base}/{i:04d}" for i in range(opts.publishers)],
                          qos=0, window=0, prefix_base=tag, **common)
        r = _load_phase(opts, host, port, pid, [], pubs, 0)
        return {"msgs_per_s": r["published_per_s"], "generator_cpu_pct": r["generator_cpu_pct"]}
    if phase == "gen_ceiling_sub":
        subs = [Job(name="sub100", role="sub", slot=100, conns=1, client_prefix=f"{tag}-s",
                    topic_filter=f"{base}/#", qos=0, **common)]
        # No publisher: the sink streams on its own once subscribed.
        sh_result = _load_phase(opts, host, port, pid, subs, [], 1)
        return {"msgs_per_s": sh_result["delivered_per_s"],
                "generator_cpu_pct": sh_result["generator_cpu_pct"]}
    if phase.startswith("fanin_qos"):
        qos = int(phase[-1])
        pubs = _slot_jobs("pub", opts.publishers, -(-opts.publishers // opts.pub_procs), 0,
                          topics=[f"{base}/{i:04d}" for i in range(opts.publishers)],
                          qos=qos, window=opts.window, inflight=64, prefix_base=tag, **common)
        subs = [Job(name="sub100", role="sub", slot=100, conns=1, client_prefix=f"{tag}-s",
                    topic_filter=f"{base}/+", qos=qos, **common)]
        return _load_phase(opts, host, port, pid, subs, pubs, 1)
    if phase.startswith("fanout"):
        n = int(phase[len("fanout"):phase.index("_")])
        qos = int(phase[-1])
        subs = _slot_jobs("sub", n, _SUBS_PER_PROC, 100, topic_filter=f"{base}/x", qos=qos,
                          prefix_base=tag, **common)
        pubs = [Job(name="pub0", role="pub", slot=0, conns=1, client_prefix=f"{tag}-p",
                    topics=[f"{base}/x"], qos=qos, window=max(64, opts.window // n),
                    inflight=64, **common)]
        r = _load_phase(opts, host, port, pid, subs, pubs, n)
        r["subscribers"] = n
        return r
    if phase == "latency":
        subs = [Job(name="sub100", role="sub", slot=100, conns=1, client_prefix=f"{tag}-s",
                    topic_filter=f"{base}/t", qos=opts.latency_qos, record_latency=True, **common)]
        pubs = [Job(name="pub0", role="latency_pub", slot=0, conns=1, client_prefix=f"{tag}-p",
                    topics=[f"{base}/t"], qos=opts.latency_qos, rate=opts.rate, **common)]
        r = _load_phase(opts, host, port, pid, subs, pubs, 1)
        r.update(rate=opts.rate, qos=opts.latency_qos)
        return r
    if phase == "idle":
        return _idle_phase(opts, server, tag)
    if is_open_phase(phase):
        def load(subs: list[Job], pubs: list[Job], fanout: int) -> dict[str, Any]:
            return _load_phase(opts, host, port, pid, subs, pubs, fanout)
        return run_open_phase(phase, opts, server, tag, load)
    raise ValueError(f"unknown phase {phase!r}")


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def _anon(pid: int | None) -> int | None:
    """Anonymous resident memory of `pid` (RSS less shared/file-backed pages)."""
    if pid is None:
        return None
    try:
        info = psutil.Process(pid).memory_info()
    except psutil.Error:
        return None
    return info.rss - getattr(info, "shared", 0)


def _sleep_sampling(pid: int | None, seconds: float) -> int:
    """Sleep `seconds`, sampling the server's anonymous memory; returns the peak."""
    peak = 0
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return peak
        time.sleep(min(_RSS_SAMPLE_S, left))
        anon = _anon(pid)
        if anon is not None and anon > peak:
            peak = anon


def _idle_phase(opts, server: MqttServer, tag: str) -> dict[str, Any]:
    n = opts.idle_connections
    per_proc = -(-n // 2)  # two processes: 5,000 sockets each for 10k (fd limits)
    jobs = _slot_jobs("idle", n, per_proc, 0, f"{tag}-idle", host=server.host, port=server.port)
    server.restart()  # a fresh process: the delta is not hidden in a heap grown earlier
    time.sleep(1.0)
    sh = _shared()
    before = _rss(server.pid)
    t0 = time.monotonic()
    try:
        ready = _spawn(sh, jobs, timeout=max(_READY_TIMEOUT_S, n / 100))
        connect_s = time.monotonic() - t0
        time.sleep(1.0)  # let the server settle (buffers, session state)
        after = _rss(server.pid)
        connected = sum(ready.values())
    finally:
        _finish(sh)
    result: dict[str, Any] = {"connections": connected, "connect_per_s": round(connected / connect_s, 1)}
    if before is not None and after is not None:
        result.update(rss_before_mb=round(before / 2**20, 1), rss_after_mb=round(after / 2**20, 1),
                      kb_per_connection=round((after - before) / 1024 / max(1, connected), 2))
    return result


# ------------------------------------------------------------------------ the run
def _start_servers(opts, tmp: str, notes: list[str]) -> dict[str, MqttServer]:
    servers: dict[str, MqttServer] = {}
    cpus = opts.server_cpu_set
    if opts.target:
        servers["target"] = target_server(opts.target)
        if cpus:
            notes.append("--target: the server is not pinned (not started here)")
    else:
        servers["lmq"] = start_lmq(tmp, cpus)
        if getattr(opts, "gateways", 1) == 2:
            servers[_mqtt_gateways.NAME] = _mqtt_gateways.start_two_gateways(opts, tmp, cpus)
    if opts.compare_mosquitto:
        mosq = start_mosquitto(tmp, opts.mosquitto_bin, cpus)
        if mosq is None:
            notes.append("mosquitto not found: no comparison")
        else:
            servers["mosquitto"] = mosq
    return servers


def _start_sink(opts):
    ctx = mp.get_context("fork")
    port_cell = ctx.RawValue("i", 0)
    sink = ctx.Process(target=sink_main, args=(port_cell, opts.size), daemon=True)
    sink.start()
    if opts.server_cpu_set:
        os.sched_setaffinity(sink.pid, opts.server_cpu_set)
    deadline = time.monotonic() + 30
    while not port_cell.value and time.monotonic() < deadline:
        time.sleep(0.02)
    return sink, MqttServer("sink", "127.0.0.1", port_cell.value, sink.pid)


def run(args: argparse.Namespace) -> int:
    opts = args
    _defaults(opts)
    phases = [p.strip() for p in opts.phases.split(",") if p.strip()]
    unknown = {p for p in phases if p not in PHASES and not is_open_phase(p)}
    if unknown:
        print(f"unknown phases: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="lmq-bench-mqtt-")
    servers: dict[str, MqttServer] = {}
    sink = None
    notes: list[str] = []
    if opts.generator_cpu_set:
        os.sched_setaffinity(0, opts.generator_cpu_set)  # this process and its workers
    try:
        if any(p in CEILINGS for p in phases):
            sink, sink_server = _start_sink(opts)
        servers = _start_servers(opts, tmp, notes)
        raw: dict[str, dict[str, list]] = {name: {} for name in servers}
        gen_raw: dict[str, list] = {}
        for run_i in range(opts.runs):
            # Alternate the order of the servers between rounds: same conditions for both.
            order = list(servers.items())
            if run_i % 2:
                order.reverse()
            for phase in phases:
                if phase in CEILINGS:
                    gen_raw.setdefault(phase, []).append(
                        run_phase(phase, opts, sink_server, f"r{run_i}"))
                    continue
                for name, server in order:
                    r = run_phase(phase, opts, server, f"r{run_i}{name[:1]}")
                    raw[name].setdefault(phase, []).append(r)
                    time.sleep(0.3)
        results = {name: {ph: median_of(rs) for ph, rs in per.items()} for name, per in raw.items()}
        report: dict[str, Any] = {
            "bench": "mqtt",
            "statistic": f"median over {opts.runs} round(s), server order alternating",
            "config": {k: getattr(opts, k) for k in (
                "duration", "warmup", "drain", "runs", "size", "publishers", "window", "rate",
                "latency_qos", "idle_connections", "device_rate", "open_size",
                "open_publishers", "step_rates")},
            "pinning": {"server": list(opts.server_cpu_set),
                        "generator": list(opts.generator_cpu_set)},
            "phases": phases,
            "servers": {n: {"host": s.host, "port": s.port, "pid": s.pid} for n, s in servers.items()},
            "generator": {ph: median_of(rs) for ph, rs in gen_raw.items()},
            "results": results,
            "runs": {name: {ph: [r.get(primary(ph)) for r in rs] for ph, rs in per.items()}
                     for name, per in raw.items()},
        }
        first = next(iter(results))
        if "mosquitto" in results and first != "mosquitto":
            report["ratios"] = ratios(results[first], results["mosquitto"])
        ceiling = report["generator"].get("gen_ceiling_sub", {}).get("msgs_per_s")
        notes += notes_for(results, ceiling, raw)
        if not opts.server_cpu_set:
            for name, per in results.items():
                for ph, r in per.items():
                    srv, gen = r.get("server_cpu_pct"), r.get("generator_cpu_pct")
                    if srv is not None and gen is not None and srv < 85 and srv + gen > 150:
                        # Server and generator share the cores: neither was the limit alone.
                        notes.append(f"{name} {ph}: machine-bound (server {srv:.0f}% + "
                                     f"generator {gen:.0f}% CPU), a lower bound")
        for name, server in servers.items():
            skips = server.log_tail(1 << 24).count(" skips ")
            if skips:  # QoS 1 'missing' may then be lost, not late
                notes.append(f"{name}: its log has {skips} 'session ... skips' line(s) "
                             "(sessions cut at max_session_lag)")
        report["notes"] = notes
        if opts.json:
            print(json.dumps(report, indent=2))
        else:
            print_table(report)
        return 0
    except RuntimeError as exc:
        print(f"bench mqtt failed: {exc}", file=sys.stderr)
        for name, server in servers.items():
            tail = server.log_tail()
            if tail:
                print(f"--- {name} log tail ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        for server in servers.values():
            server.stop()
        if sink is not None:
            sink.terminate()
            sink.join(5)
        shutil.rmtree(tmp, ignore_errors=True)


def options(argv: list[str]) -> argparse.Namespace:
    """Parsed options with their defaults filled in (for callers other than the CLI)."""
    parser = argparse.ArgumentParser(prog="lmq bench mqtt")
    add_arguments(parser)
    opts = parser.parse_args(argv)
    _defaults(opts)
    return opts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmq bench mqtt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

