"""`lmq bench <name> [options]`: run the benchmark module `lmq/bench/<name>.py`.

A benchmark is found by its module name, so adding `lmq/bench/broker.py` adds
`lmq bench broker` without touching this file. Modules are imported only when run (a
benchmark's dependencies never slow down or break the rest of the CLI). A benchmark
module provides:

* `add_arguments(parser)` — its options;
* `run(args) -> int` — the benchmark (prints a table, or one JSON object with `--json`);
* a module docstring, used as its help text.

Modules whose name starts with "_" are helpers, not benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def bench_names() -> list[str]:
    """Benchmark module names under the `lmq.bench` package (nothing is imported)."""
    from lmq import bench

    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmarks (figures as ratios to a baseline measured in the same run)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="one of: " + ", ".join(bench_names()))
    parser.add_argument("options", nargs=argparse.REMAINDER, help="options of that benchmark")
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    names = bench_names()
    if args.name is None:
        parser.print_help()
        return 2
    if args.name not in names:
        parser.error(f"unknown benchmark {args.name!r} (choose from {', '.join(names)})")
    module = importlib.import_module(f"lmq.bench.{args.name}")
    if not hasattr(module, "run"):
        parser.error(f"lmq.bench.{args.name} is not a benchmark (it has no run())")
    sub = argparse.ArgumentParser(
        prog=f"lmq bench {args.name}", description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if hasattr(module, "add_arguments"):
        module.add_arguments(sub)
    options = sub.parse_args(args.options)
    from lmq.progress import Progress

    # A live line on a terminal (phases reported with lmq.progress.phase), none when piped.
    with Progress(f"lmq bench {args.name}"):
        return int(module.run(options) or 0)
