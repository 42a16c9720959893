"""Options several `lmq bench` commands share: how long and how often to measure, and
where the server and the load generator run (CPU pinning)."""

from __future__ import annotations

import argparse


def add_run_arguments(parser: argparse.ArgumentParser, *, quick: str,
                      duration: float = 5.0, warmup: float = 1.0, runs: int = 3,
                      resolved_later: bool = False) -> None:
    """--quick (help `quick`), --json, --duration, --warmup and --runs. With
    `resolved_later` the three numbers default to None (the command fills them in, smaller
    under --quick) and their help names the full-run values."""

    def default(value: float) -> tuple[float | None, str]:
        return (None, f"({value:g})") if resolved_later else (value, "(default %(default)s)")

    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    value, shown = default(duration)
    parser.add_argument("--duration", type=float, default=value,
                        help=f"measured seconds per phase {shown}")
    value, shown = default(warmup)
    parser.add_argument("--warmup", type=float, default=value,
                        help=f"unmeasured seconds before each phase {shown}")
    value, shown = default(runs)
    parser.add_argument("--runs", type=int, default=value,
                        help=f"repetitions; medians are reported {shown}")


def add_pin_arguments(parser: argparse.ArgumentParser) -> None:
    """The "honest figures" group: --pin, --server-cpus, --generator-cpus (pin_cpus)."""
    g = parser.add_argument_group("honest figures")
    g.add_argument("--pin", choices=("auto", "off"), default="auto",
                   help="pin the server and the generator to separate CPUs (auto: the first "
                        "allowed CPU for the server, the rest for the generator)")
    g.add_argument("--server-cpus", default=None, help="comma-separated CPUs of the server")
    g.add_argument("--generator-cpus", default=None,
                   help="comma-separated CPUs of the load generator")
