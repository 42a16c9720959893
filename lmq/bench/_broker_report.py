"""Report of `lmq bench broker`: medians over runs, ratios to the baseline, targets, and
the human table (the JSON form is the same dict)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["BASELINE", "PHASES", "TARGETS", "TARGET_P99_MS", "build_report", "print_table"]

PHASES = ("gen_ceiling", "echo_tcp", "echo_latency", "echo_local",
          "send", "batch", "pull", "latency", "local_send")
BASELINE = "echo_tcp"
_LATENCY_PHASES = ("echo_latency", "latency")

# What the lead compares against (2-core machine): msg/s floors and the p99 ceiling.
TARGETS = {"send": 30_000, "batch": 150_000, "pull": 200_000}
TARGET_P99_MS = 2.0

_DESCRIPTIONS = {
    "gen_ceiling": "generator vs canned answers (no remoting)",
    "echo_tcp": "remoting echo server = BASELINE",
    "echo_latency": "echo, sync sends at {rate}/s",
    "echo_local": "echo via in-process transport",
    "send": "SEND_MESSAGE_V2 {size} B, {inflight} in flight",
    "batch": "SEND_BATCH_MESSAGE x{batch}, {batch_inflight} in flight",
    "pull": "PULL_MESSAGE x{pull}, {pull_inflight} in flight",
    "latency": "sync send at {rate}/s (from due time)",
    "local_send": "send via in-process transport, {inflight} tasks",
}


_MET = {True: "met", False: "MISSED", None: "not measured"}


def _median(values: list[Any]) -> Any:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(nums) if nums else None


def build_report(opts, phases, results, failures, profiles, profile_errors) -> dict[str, Any]:
    """One dict for the whole bench: per phase the medians of its runs' figures, the
    ratio to the BASELINE median (latency: to the echo latency), errors; the targets."""
    out: dict[str, Any] = {
        "bench": "broker",
        "config": {k: getattr(opts, k) for k in (
            "target", "runs", "duration", "warmup", "inflight", "connections", "size",
            "batch", "batch_inflight", "pull", "pull_inflight", "rate", "flush",
            "commitlog_mb")},
        "baseline": BASELINE,
        "phases": {},
    }
    base = _median([r.get("value") for r in results.get(BASELINE, [])])
    base_lat = {k: _median([r.get(k) for r in results.get("echo_latency", [])])
                for k in ("p50_ms", "p99_ms")}
    for phase in phases:
        runs = [r for r in results[phase] if r]
        entry: dict[str, Any] = {"description": _DESCRIPTIONS[phase].format(**vars(opts))}
        if phase in failures:
            entry["error"] = failures[phase]
        if runs:
            keys = [k for k in runs[0] if k not in ("first_error", "queue_depths")]
            entry.update({k: _median([r.get(k) for r in runs]) for k in keys})
            entry["errors"] = sum(r.get("errors") or 0 for r in runs)
            first = next((r["first_error"] for r in runs if r.get("first_error")), None)
            if first:
                entry["first_error"] = first
            if phase in _LATENCY_PHASES:
                entry["unit"] = "ms"
                entry["runs"] = [r.get("p99_ms") for r in runs]
                for k in ("p50_ms", "p99_ms"):
                    b = base_lat.get(k)
                    entry[f"{k[:-3]}_ratio"] = entry[k] / b if b and entry.get(k) else None
            else:
                entry["unit"] = "msg/s" if phase in ("send", "batch", "pull", "local_send") \
                    else "round trips/s"
                entry["runs"] = [r.get("value") for r in runs]
                entry["ratio"] = entry["value"] / base if base and entry.get("value") else None
        out["phases"][phase] = entry
    targets = {}
    for phase, floor in TARGETS.items():
        value = out["phases"].get(phase, {}).get("value")
        if phase in phases:
            targets[phase] = {"target": f">= {floor} msg/s", "value": value,
                              "met": None if value is None else value >= floor}
    if "latency" in phases:
        p99 = out["phases"]["latency"].get("p99_ms")
        targets["latency"] = {"target": f"p99 < {TARGET_P99_MS} ms", "value": p99,
                              "met": None if p99 is None else p99 < TARGET_P99_MS}
    out["targets"] = targets
    if profiles or profile_errors:
        out["profile"] = {"dir": opts.profile, "hot_spots": profiles, "errors": profile_errors}
    return out


def _clip(text: str | None, n: int = 160) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(report: dict[str, Any]) -> None:
    """The human-readable form of `report`."""
    c = report["config"]
    where = c["target"] or "lmq serve child process"
    print(f"lmq bench broker: {where}; medians of {c['runs']} run(s) x {c['duration']} s "
          f"(+{c['warmup']} s warm-up), {c['connections']} connection(s), flush={c['flush']}")
    m = report.get("machine")
    if m:
        print(f"{m['cpus']} CPUs, load average {m['loadavg_start'][0]:.2f} at start, "
              f"{m['loadavg_end'][0]:.2f} at end")
    print("ratio = figure / echo_tcp round trips per second (the remoting transport "
          "ceiling, same run)\n")
    print(f"{'phase':<13}{'what':<44}{'value':>14} {'unit':<14}{'ratio':>7}  cpu gen/srv"
          "  per srv cpu-s")
    for phase, e in report["phases"].items():
        if "unit" not in e:
            print(f"{phase:<13}{e['description']:<44}  FAILED: {_clip(e.get('error'))}")
            continue
        if e["unit"] == "ms":
            value = f"{_fmt(e.get('p50_ms'))}/{_fmt(e.get('p99_ms'))}"
            ratio = f"{_fmt(e.get('p50_ratio'), '.1f')}/{_fmt(e.get('p99_ratio'), '.1f')}"
            print(f"{phase:<13}{e['description']:<44}{value:>14} {'ms p50/p99':<14}{ratio:>7}"
                  f"  (from write: {_fmt(e.get('write_p50_ms'))}/{_fmt(e.get('write_p99_ms'))}"
                  f", p99.9 {_fmt(e.get('p999_ms'))}, max {_fmt(e.get('max_ms'))})")
        else:
            cpu = f"{_fmt(e.get('client_cpu'))}/{_fmt(e.get('server_cpu'))}"
            print(f"{phase:<13}{e['description']:<44}{_fmt_rate(e.get('value')):>14} "
                  f"{e['unit']:<14}{_fmt(e.get('ratio')):>7}  {cpu:<11}"
                  f"  {_fmt_rate(e.get('per_server_cpu_s'))}")
        if e.get("errors"):
            print(f"{'':<13}  {e['errors']} error answers, first: {_clip(e.get('first_error'))}")
        if e.get("error"):
            print(f"{'':<13}  later run failed: {_clip(e['error'])}")
    if report["targets"]:
        print("\ntargets: " + "; ".join(
            f"{k} {t['target']}: {_MET[t['met']]}"
            for k, t in report["targets"].items()))
    prof = report.get("profile")
    if prof:
        print(f"\nbroker profile (py-spy, first run; raw stacks in {prof['dir']}):")
        for phase, spots in prof["hot_spots"].items():
            print(f"  {phase} ({spots['samples']} samples) self time:")
            for name, share in spots["self_lines"][:8]:
                print(f"    {share:6.1%}  {name}")
        for phase, err in prof["errors"].items():
            print(f"  {phase}: profiling failed: {err}")
