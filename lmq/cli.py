"""`lmq` — the single command-line entry point.

Each subcommand lives in its own module under `lmq.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func` to a callable taking the
parsed arguments and returning an exit code. Modules are imported lazily by name so a
missing optional dependency of one subcommand never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Order is the order shown in `lmq --help`.
SUBCOMMAND_MODULES = ("serve", "namesrv", "broker", "mqtt", "admin", "bench", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmq",
        description="lmq-gateway: MQTT / AMQP / RocketMQ gateway over a lightweight-queue store",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"lmq.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"lmq.commands.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
