"""The report of `lmq bench mqtt`: medians over rounds, ratios to Mosquitto, the table.

Every figure is the median over the rounds (``--runs``) of one phase against one server,
and is labelled so; rounds alternate the order of the servers (ours first, then
Mosquitto first, ...), so neither always runs on a warmer or cooler machine.
"""

from __future__ import annotations

import statistics
from typing import Any

from lmq.bench._mqtt_open import generator_overloaded, is_open_phase

__all__ = ["CEILINGS", "flat_rows", "median_of", "notes_for", "primary", "print_table", "ratios"]

CEILINGS = ("gen_ceiling_pub", "gen_ceiling_sub")
_PRIMARY = {"latency": "p99_ms", "idle": "kb_per_connection"}
#: Figures of an open-loop phase shown in the table, in this order.
_OPEN_KEYS = ("delivered_per_s", "published_per_s", "in_time_pct", "loss_pct", "p50_ms",
              "p99_ms", "per_server_cpu_s", "server_cpu_pct", "generator_cpu_pct",
              "server_rss_mb", "server_anon_peak_mb", "ping_p50_ms", "ping_p99_ms", "ping_max_ms")
_STEP_KEYS = ("delivered_per_s", "in_time_pct", "p99_ms", "server_cpu_pct")
#: Figures where a higher value is better (ratios are shown for these and latencies).
_RATIO_KEYS = {"delivered_per_s", "per_server_cpu_s", "highest_sustained_per_s", "p50_ms",
               "p99_ms", "kb_per_connection", "ping_p99_ms"}


def median_of(runs: list[dict[str, Any]], *, top: bool = True) -> dict[str, Any]:
    """Per key, the median over the rounds (nested dicts key by key; a key missing from
    some rounds, such as a step a round did not reach, over the rounds that have it).
    The top level also says over how many rounds (`rounds`)."""
    out: dict[str, Any] = {}
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r if k not in keys]
    for key in keys:
        have = [r[key] for r in runs if key in r]
        if all(isinstance(v, dict) for v in have):
            out[key] = median_of(have, top=False)
        elif all(isinstance(v, bool) for v in have):
            out[key] = sum(have) * 2 > len(have)  # the majority
        elif all(isinstance(v, int | float) for v in have):
            out[key] = round(statistics.median(have), 3)
        else:
            out[key] = have[0]
    if top:
        out.setdefault("rounds", len(runs))
    return out


def primary(phase: str) -> str:
    if phase in CEILINGS:
        return "msgs_per_s"
    if phase == "steps":
        return "highest_sustained_per_s"
    return _PRIMARY.get(phase, "delivered_per_s")


def flat_rows(phase: str, r: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(row label, figure, value) of one phase's result, as the table shows them."""
    if phase == "steps":
        rows = [(phase, "highest_sustained_per_s", r.get("highest_sustained_per_s"))]
        for rate, step in r.get("steps", {}).items():
            rows += [(f"steps@{rate}/s", k, step.get(k)) for k in _STEP_KEYS]
        return rows
    if is_open_phase(phase):
        return [(phase, k, r.get(k)) for k in _OPEN_KEYS if k in r]
    if phase == "latency":
        return [(phase, k, r.get(k)) for k in ("p50_ms", "p99_ms")]
    rows = [(phase, primary(phase), r.get(primary(phase)))]
    if "per_server_cpu_s" in r:
        rows.append((phase, "per_server_cpu_s", r.get("per_server_cpu_s")))
    return rows


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """ours / theirs for the throughput, latency and memory figures both have."""
    out = {}
    for phase, r in ours.items():
        t = theirs.get(phase)
        if not t:
            continue
        theirs_rows = {(label, k): v for label, k, v in flat_rows(phase, t)}
        for label, key, a in flat_rows(phase, r):
            b = theirs_rows.get((label, key))
            if key in _RATIO_KEYS and isinstance(a, int | float) and isinstance(b, int | float) and b:
                out[f"{label}.{key}"] = round(a / b, 3)
    return out


def notes_for(results: dict[str, dict[str, Any]], ceiling: float | None,
              rounds: dict[str, dict[str, list]] | None = None) -> list[str]:
    """Warnings about figures that may not measure the server: every round (`rounds`:
    per server, per phase, the result of each round) whose generator was busy, and
    medians above half the generator's subscriber ceiling."""
    notes = []
    for name, per in (rounds or {n: {ph: [r] for ph, r in p.items()}
                                 for n, p in results.items()}).items():
        for ph, runs in per.items():
            for i, r in enumerate(runs):
                parts = [(ph, r)] + [(f"steps@{k}/s", s) for k, s in r.get("steps", {}).items()]
                for label, x in parts:
                    if generator_overloaded(x):
                        notes.append(f"{name} {label} (round {i + 1}): a generator process used "
                                     f"{x['generator_max_proc_cpu_pct']:.0f}% of a core "
                                     "(> 80%): the generator may be the limit")
    for name, per in results.items():
        for ph, r in per.items():
            rate = r.get("delivered_per_s")
            if ceiling and rate and rate > 0.5 * ceiling and "fanout" not in ph:
                notes.append(f"{name} {ph}: {rate:,.0f}/s is over half the generator's "
                             f"subscriber ceiling ({ceiling:,.0f}/s)")
    return notes


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key.endswith(("_ms", "connection", "_pct")):
        return f"{v:,.2f}"
    return f"{v:,.0f}"


def print_table(report: dict[str, Any]) -> None:
    names = list(report["results"])
    has_ratio = bool(report.get("ratios"))
    rounds = report["config"].get("runs", 1)
    cols = ["phase", "metric", *names] + (["ratio"] if has_ratio else [])
    rows = []
    for phase, r in report["generator"].items():
        rows.append([phase, "msgs/s", f"{r['msgs_per_s']:,.0f}"] + [""] * (len(cols) - 3))
    for phase in report["phases"]:
        if phase in CEILINGS:
            continue
        order: list[tuple[str, str]] = []
        values: dict[tuple[str, str], dict[str, Any]] = {}
        for name in names:
            for label, key, v in flat_rows(phase, report["results"][name].get(phase, {})):
                if (label, key) not in values:
                    order.append((label, key))
                    values[(label, key)] = {}
                values[(label, key)][name] = v
        for label, key in order:
            row = [label, key] + [_fmt(key, values[(label, key)].get(n)) for n in names]
            if has_ratio:
                ratio = report["ratios"].get(f"{label}.{key}")
                row.append("-" if ratio is None else f"{ratio:.2f}")
            rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows, strict=False)]
    print(f"medians over {rounds} round(s); server CPUs {report['pinning']['server'] or 'any'}, "
          f"generator CPUs {report['pinning']['generator'] or 'any'}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    if has_ratio:
        print("ratio = first server / mosquitto: above 1 is faster for throughput, "
              "slower (latency) or heavier (kb_per_connection) for the others")
    for note in report.get("notes", []):
        print(f"note: {note}")
