"""Open-loop phases of `lmq bench mqtt` and the honest-figures helpers (CPU pinning, CPU
accounting, the generator check).

Open loop: publishers are paced by a schedule (lmq/bench/_mqtt_paced.py) or not paced at all,
never by what subscribers received, as real devices are. A phase reports what arrived
*during* its window (``delivered_per_s``), what never arrived after a short drain
(``missing``, ``loss_pct``), latency from each message's due time, and the share of the
messages due in the window that arrived within 1 s (``in_time_pct``); a phase is
*sustained* when that share is at least 99 %.

=======================  ============================================================
devices<N>               N connections x ``--device-rate`` msg/s each (staggered), QoS 0,
                         ``--open-size`` B, one topic per device under ``iot/<run>/``,
                         one subscriber on ``iot/<run>/#``
steps                    ``--open-publishers`` connections at fixed total rates
                         (``--step-rates``), QoS 0, one subscriber on ``bench/<run>/#``;
                         stops at the first rate not sustained; reports the highest
                         sustained rate (``highest_sustained_per_s``)
unpaced_fanin_qos0/1     ``--open-publishers`` publishers as fast as TCP takes them
                         (QoS 1: at most 64 unacknowledged each), one subscriber
unpaced_fanout100        one publisher as fast as TCP takes it, 100 subscribers, 64 B
=======================  ============================================================
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from lmq.bench._mqtt_loadgen import Job

__all__ = ["OPEN_PHASES", "generator_overloaded", "is_open_phase", "open_result",
           "pin_cpus", "run_open_phase"]

OPEN_PHASES = ("devices1000", "devices2000", "steps", "unpaced_fanin_qos0",
               "unpaced_fanin_qos1", "unpaced_fanout100")
#: Share of the messages due in the window that must arrive within 1 s (sustained).
SUSTAINED_PCT = 99.0
#: A generator process above this share of a core may be measuring itself.
GENERATOR_BUSY_PCT = 80.0
_FANOUT_SIZE = 64
_SUBS_PER_PROC = 50


def is_open_phase(phase: str) -> bool:
    return phase in OPEN_PHASES or (phase.startswith("devices") and phase[7:].isdigit())


# ------------------------------------------------------------------------ pinning
def pin_cpus(spec: str, server_cpus: str | None, generator_cpus: str | None
             ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(server CPUs, generator CPUs). `spec` "auto": the first allowed CPU for the server,
    the others for the generator (no pinning with fewer than 2); "off": none."""
    def parse(text: str) -> tuple[int, ...]:
        return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))

    if spec == "off" or not hasattr(os, "sched_getaffinity"):
        return (), ()
    allowed = sorted(os.sched_getaffinity(0))
    srv = parse(server_cpus) if server_cpus else tuple(allowed[:1])
    gen = parse(generator_cpus) if generator_cpus else tuple(c for c in allowed if c not in srv)
    if not srv or not gen:
        return (), ()
    return srv, gen


def generator_overloaded(r: dict[str, Any]) -> bool:
    """True when a generator process used more than `GENERATOR_BUSY_PCT` of a core."""
    return r.get("generator_max_proc_cpu_pct", 0.0) > GENERATOR_BUSY_PCT


# ------------------------------------------------------------------------ results
def _pct(sorted_s: list[float], p: float) -> float:
    k = min(len(sorted_s) - 1, max(0, round(p / 100 * (len(sorted_s) - 1))))
    return round(sorted_s[k] * 1000, 3)


def open_result(result: dict[str, Any], reports: list[tuple], sent: int, fanout: int) -> None:
    """Add the open-loop figures to a phase result, from what the workers reported."""
    window_sent = sum(r[2] for r in reports if r[0] == "window_sent")
    opened = [r for r in reports if r[0] == "open"]
    total = sent * fanout if fanout else 0
    result["loss_pct"] = round(100 * result["missing"] / total, 3) if total else 0.0
    if not opened:
        return
    in_window = sum(r[2] for r in opened)
    in_time = sum(r[3] for r in opened)
    lats = sorted(x for r in opened for x in r[4])
    expected = window_sent * fanout
    result.update(window_sent=window_sent, window_received=in_window,
                  in_time_pct=round(100 * in_time / expected, 3) if expected else 0.0)
    result["sustained"] = bool(expected) and result["in_time_pct"] >= SUSTAINED_PCT
    if lats:
        result.update(p50_ms=_pct(lats, 50), p90_ms=_pct(lats, 90), p99_ms=_pct(lats, 99),
                      max_ms=round(lats[-1] * 1000, 3))


# ------------------------------------------------------------------------ phases
def _paced_jobs(n: int, per_proc: int, rate: float, topics: list[str], first_slot: int,
                prefix: str, **common: Any) -> list[Job]:
    """`n` paced connections (one topic each) over processes of `per_proc` connections."""
    jobs = []
    nprocs = -(-n // per_proc)
    for p in range(nprocs):
        lo, hi = p * per_proc, min(n, (p + 1) * per_proc)
        slot = first_slot + p
        jobs.append(Job(name=f"paced{slot}", role="paced_pub", slot=slot, conns=hi - lo,
                        client_prefix=f"{prefix}-p{slot}", topics=topics[lo:hi], qos=0,
                        rate=rate, phase_s=p / (rate * n), **common))
    return jobs


def _subscriber(tag: str, topic_filter: str, qos: int, record: bool, **common: Any) -> Job:
    return Job(name="sub100", role="sub", slot=100, conns=1, client_prefix=f"{tag}-s",
               topic_filter=topic_filter, qos=qos, record_open=record, **common)


LoadPhase = Callable[..., dict[str, Any]]


def run_open_phase(phase: str, opts, server, tag: str, load_phase: LoadPhase) -> dict[str, Any]:
    """One measurement of an open-loop `phase`; `load_phase(subs, pubs, fanout)` runs it."""
    common = dict(host=server.host, port=server.port, size=opts.open_size)
    if phase.startswith("devices"):
        n = int(phase[len("devices"):])
        base = f"iot/{tag}"
        pubs = _paced_jobs(n, opts.devices_per_proc, opts.device_rate,
                           [f"{base}/d{i:05d}" for i in range(n)], 0, tag, **common)
        r = load_phase([_subscriber(tag, f"{base}/#", 0, True, **common)], pubs, 1)
        r.update(devices=n, target_per_s=n * opts.device_rate)
        return r
    base = f"bench/{tag}/{phase}"
    if phase == "steps":
        steps: dict[str, Any] = {}
        best = 0.0
        n = opts.open_publishers
        for rate in opts.step_rates:
            pubs = _paced_jobs(n, n, rate / n, [f"{base}/{rate:g}/{i}" for i in range(n)], 0,
                               f"{tag}-{rate:g}", **common)
            sub = _subscriber(f"{tag}-{rate:g}", f"{base}/{rate:g}/#", 0, True, **common)
            r = load_phase([sub], pubs, 1)
            steps[f"{rate:g}"] = r
            if not r.get("sustained"):
                break
            best = rate
        return {"highest_sustained_per_s": best, "steps": steps}
    if phase.startswith("unpaced_fanin_qos"):
        qos = int(phase[-1])
        n = opts.open_publishers
        pubs = [Job(name=f"pub{i}", role="pub", slot=i, conns=1, client_prefix=f"{tag}-p{i}",
                    topics=[f"{base}/{i}"], qos=qos, window=0, inflight=64, **common)
                for i in range(n)]
        return load_phase([_subscriber(tag, f"{base}/+", qos, False, **common)], pubs, 1)
    if phase == "unpaced_fanout100":
        common["size"] = _FANOUT_SIZE
        subs = []
        for k in range(0, 100, _SUBS_PER_PROC):
            slot = 100 + k // _SUBS_PER_PROC
            subs.append(Job(name=f"sub{slot}", role="sub", slot=slot,
                            conns=min(_SUBS_PER_PROC, 100 - k), client_prefix=f"{tag}-s{slot}",
                            topic_filter=f"{base}/x", qos=0, **common))
        pubs = [Job(name="pub0", role="pub", slot=0, conns=1, client_prefix=f"{tag}-p",
                    topics=[f"{base}/x"], qos=0, window=0, **common)]
        r = load_phase(subs, pubs, 100)
        r["subscribers"] = 100
        return r
    raise ValueError(f"unknown open-loop phase {phase!r}")
