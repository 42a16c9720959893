"""`lmq` — the single command-line entry point.

Each subcommand lives in its own module under `lmq.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func` to a callable taking the
parsed arguments and returning an exit code. Modules are imported lazily by name so a
missing optional dependency of one subcommand never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order is the order shown in `lmq --help`.
SUBCOMMAND_MODULES = ("serve", "namesrv", "broker", "mqtt", "amqp", "admin", "bench", "demo")
# Commands that run a server: they take --log-format / --log-file (lmq.commands._startup).
SERVER_COMMANDS = ("serve", "namesrv", "broker", "mqtt", "amqp")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmq",
        description="lmq-gateway: MQTT / AMQP / RocketMQ gateway over a lightweight-queue store",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"lmq.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"lmq.commands.{name}":
                raise
            continue
        module.register(subparsers)
    from lmq.commands._startup import add_log_options

    for name in SERVER_COMMANDS:
        sub = subparsers.choices.get(name)
        if sub is not None:
            add_log_options(sub)
    return parser


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("lmq-gateway")
    except PackageNotFoundError:
        return "unknown (not installed)"


# Added apart from the tuple above so that other additions to it merge cleanly.
SUBCOMMAND_MODULES += ("proxy",)  # the RocketMQ 5 gRPC proxy (docs/grpc.md)
SERVER_COMMANDS += ("proxy",)  # --log-format / --log-file too


def _subcommand_parser(parser: argparse.ArgumentParser, name: str | None):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def _broken_pipe(exc: BaseException) -> bool:
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_broken_pipe(e) for e in exc.exceptions)
    return False


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help, --version and usage errors
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # inside the try: a reader gone shows here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if not _broken_pipe(exc):
            raise
        # The reader went away (`lmq admin tail X | head`): stop quietly, as `cat` does.
        # Point stdout at /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        # Report an unknown flag against the subcommand's own usage, so that
        # `lmq serve --bad` points at `lmq serve --help`, not at `lmq --help`.
        sub = _subcommand_parser(parser, args.command) or parser
        sub.error(f"unrecognized arguments: {' '.join(extras)} (see {sub.prog} --help)")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if args.command in SERVER_COMMANDS and hasattr(args, "log_format"):
        from lmq.commands._startup import configure_logging

        try:
            configure_logging(getattr(args, "log_level", "INFO"), args.log_format,
                              args.log_file)
        except OSError as exc:
            print(f"lmq {args.command}: cannot write the log file {args.log_file}: "
                  f"{exc.strerror} (choose another --log-file)", file=sys.stderr)
            return 1
    return int(func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
